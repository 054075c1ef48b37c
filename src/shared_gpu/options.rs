//! What a process says of itself when it joins a shared GPU: its soft share, hard limit
//! (its own or the MPS pinned memory limit), name and ledger; sizes as bytes, byte strings or
//! percentages of the device.

use crate::error::{Error, Result};

/// What a process joining a shared GPU says of itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShareOptions {
    /// Its soft share in bytes (default: an equal part of what others' asked shares leave).
    pub soft_share: Option<u64>,
    /// Its hard limit in bytes (default: the MPS pinned memory limit where one is set, else
    /// none).
    pub hard_limit: Option<u64>,
    /// A name for people (default: the program's).
    pub name: Option<String>,
    /// The ledgers' directory (default: [`super::ledger_dir::default_base`]).
    pub directory: Option<std::path::PathBuf>,
    /// The device's ledger (default: the GPU's UUID; for a simulated device
    /// `simulated-<bytes>`).
    pub device_key: Option<String>,
}

/// A size in `s`: a byte specification ([`read_byte_spec`](crate::report::read_byte_spec):
/// `"10GiB"`, `"4GB"`, bytes) or a percentage of `total` (`"25%"`); `None` when it is neither.
pub fn parse_size(s: &str, total: u64) -> Option<u64> {
    let s = s.trim();
    if let Some(percent) = s.strip_suffix('%') {
        let p: f64 = percent.trim().parse().ok()?;
        return (0.0..=100.0)
            .contains(&p)
            .then(|| (total as f64 * p / 100.0) as u64);
    }
    crate::report::read_byte_spec(s)
        .ok()
        .and_then(|b| u64::try_from(b).ok())
}

/// A size as MPS writes it (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`): bytes, or a number with K, M,
/// G or T (powers of 1024); `None` when it is not one or overflows.
fn mps_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (digits, shift) = match s.chars().last()?.to_ascii_uppercase() {
        'K' => (&s[..s.len() - 1], 10),
        'M' => (&s[..s.len() - 1], 20),
        'G' => (&s[..s.len() - 1], 30),
        'T' => (&s[..s.len() - 1], 40),
        _ => (s, 0),
    };
    digits
        .trim()
        .parse::<u64>()
        .ok()?
        .checked_mul(1u64 << shift)
}

/// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` for device `ordinal`: `"2G"` (every device) or
/// `"0=1G,1=2G"` (sizes as MPS writes them).
pub fn mps_limit(value: &str, ordinal: usize) -> Option<u64> {
    if !value.contains('=') {
        return mps_size(value);
    }
    value.split(',').find_map(|part| {
        let (device, limit) = part.split_once('=')?;
        (device.trim().parse::<usize>().ok()? == ordinal).then(|| mps_size(limit))?
    })
}

impl ShareOptions {
    /// The options in the environment: `RRMM_SHARE_SOFT` and `RRMM_SHARE_HARD` (sizes or
    /// percentages of the device's `total` bytes), `RRMM_SHARE_NAME`; the directory is
    /// `RRMM_LEDGER_DIR`'s.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the variable that is not a size.
    pub fn from_env(total: u64) -> Result<ShareOptions> {
        let size = |var: &'static str| -> Result<Option<u64>> {
            match std::env::var(var) {
                Ok(v) if !v.trim().is_empty() => parse_size(&v, total).map(Some).ok_or_else(|| {
                    Error::invalid(var, format!("{v:?} is not a size (bytes, 10GiB, 25%)"))
                }),
                _ => Ok(None),
            }
        };
        Ok(ShareOptions {
            soft_share: size("RRMM_SHARE_SOFT")?,
            hard_limit: size("RRMM_SHARE_HARD")?,
            name: std::env::var("RRMM_SHARE_NAME")
                .ok()
                .filter(|n| !n.is_empty()),
            directory: None,
            device_key: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mps_limits_are_read_per_device() {
        assert_eq!(mps_limit("2G", 0), Some(2 << 30));
        assert_eq!(mps_limit("0=1G,1=512M", 1), Some(512 << 20));
        assert_eq!(mps_limit("0=1G,1=512M", 2), None);
        assert_eq!(mps_limit("1048576", 3), Some(1 << 20));
        assert_eq!(mps_limit("lots", 0), None);
        assert_eq!(parse_size("25%", 1000), Some(250));
        assert_eq!(parse_size("10GiB", 0), Some(10 << 30));
        assert_eq!(parse_size("3 kb", 0), Some(3000));
        assert_eq!(
            parse_size("4G", 0),
            None,
            "a bare unit, as everywhere in rrmm"
        );
        assert_eq!(parse_size("101%", 1000), None);
        assert_eq!(
            mps_limit("99999999999T", 0),
            None,
            "overflow is no limit, not a wrap"
        );
    }
}
