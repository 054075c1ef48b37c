//! What a process says of itself when it joins a shared GPU ([`ShareOptions`]): its soft share
//! and hard limit (sizes, or percentages of the device), its name and its ledger; and their
//! checking, whole, before anything changes ([`ShareOptions::check`]): `reinitialize` checks
//! them before it replaces any resource, [`super::join`] before it leaves an old ledger.
//!
//! The hard limit is the user's, else the MPS pinned memory limit the driver enforces
//! (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`, read as MPS writes it: [`mps_limit`]).

use super::ledger_dir::{self, valid_key};
use crate::error::{Error, Result};
use std::path::PathBuf;

/// The variable of the MPS pinned memory limit.
pub const MPS_LIMIT_VAR: &str = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT";

/// A size as given: bytes, or a percentage of the device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Size {
    /// Bytes.
    Bytes(u64),
    /// A percentage of the device's bytes, 0 to 100.
    Percent(f64),
}

impl From<u64> for Size {
    fn from(bytes: u64) -> Size {
        Size::Bytes(bytes)
    }
}

impl std::fmt::Display for Size {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Size::Bytes(b) => write!(f, "{b} bytes"),
            Size::Percent(p) => write!(f, "{p}%"),
        }
    }
}

impl Size {
    /// The size in `text`: a byte specification
    /// ([`read_byte_spec`](crate::report::read_byte_spec): `"10GiB"`, `"4GB"`, bytes) or a
    /// percentage of the device (`"25%"`, 0 to 100).
    ///
    /// # Errors
    /// Why it is neither, in words.
    pub fn parse(text: &str) -> std::result::Result<Size, String> {
        let s = text.trim();
        if let Some(percent) = s.strip_suffix('%') {
            return match percent.trim().parse::<f64>() {
                Ok(p) if (0.0..=100.0).contains(&p) => Ok(Size::Percent(p)),
                _ => Err(format!(
                    "{text:?} is not a percentage of the device (0% to 100%)"
                )),
            };
        }
        crate::report::read_byte_spec(s)
            .ok()
            .and_then(|b| u64::try_from(b).ok())
            .map(Size::Bytes)
            .ok_or_else(|| {
                format!(
                    "{text:?} is not a size: bytes, a byte string such as \"10GiB\" or \"4GB\", \
                     or a percentage of the device such as \"25%\""
                )
            })
    }

    /// Its bytes on a device of `total` bytes.
    pub fn bytes(&self, total: u64) -> u64 {
        match *self {
            Size::Bytes(b) => b,
            Size::Percent(p) => (total as f64 * p / 100.0) as u64,
        }
    }

    /// Its bytes where they are known: always for bytes, for a percentage only with the
    /// device's `total`.
    fn known(&self, total: Option<u64>) -> Option<u64> {
        match (self, total) {
            (Size::Bytes(b), _) => Some(*b),
            (Size::Percent(_), Some(total)) => Some(self.bytes(total)),
            (Size::Percent(_), None) => None,
        }
    }
}

/// A size in `s` on a device of `total` bytes ([`Size::parse`]); `None` when it is not one.
pub fn parse_size(s: &str, total: u64) -> Option<u64> {
    Size::parse(s).ok().map(|size| size.bytes(total))
}

/// A size as MPS writes it: bytes, or a whole number with K, M, G or T (powers of 1024),
/// optionally followed by B (NVIDIA's documentation writes `512MB`).
fn mps_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let upper = s.to_ascii_uppercase();
    let unit = upper.strip_suffix('B').unwrap_or(&upper);
    let (digits, shift) = match unit.chars().last()? {
        'K' => (&unit[..unit.len() - 1], 10),
        'M' => (&unit[..unit.len() - 1], 20),
        'G' => (&unit[..unit.len() - 1], 30),
        'T' => (&unit[..unit.len() - 1], 40),
        _ if unit.len() == upper.len() => (unit, 0),
        _ => return None,
    };
    let digits = digits.trim();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(1u64 << shift)
}

/// The MPS pinned memory limit of device `ordinal` in `value` (the variable's text): `"2G"`
/// (every device) or `"0=1G,1=512MB"`; `Ok(None)` when it names other devices only.
///
/// # Errors
/// Why the text is not a limit MPS would read, in words: a limit the driver enforces that is
/// read wrong must never silently mean none.
pub fn mps_limit(value: &str, ordinal: usize) -> std::result::Result<Option<u64>, String> {
    let bad = |part: &str| {
        format!(
            "{MPS_LIMIT_VAR}={value:?}: {part:?} is not a size as MPS writes it (a whole number \
             of bytes, or with K, M, G or T: \"2G\", \"512MB\"; per device \"0=1G,1=512M\")"
        )
    };
    if !value.contains('=') {
        return mps_size(value).map(Some).ok_or_else(|| bad(value));
    }
    let mut found = None;
    for part in value.split(',').filter(|p| !p.trim().is_empty()) {
        let (device, limit) = part.split_once('=').ok_or_else(|| bad(part))?;
        let device: usize = device.trim().parse().map_err(|_| bad(part))?;
        let limit = mps_size(limit).ok_or_else(|| bad(part))?;
        if device == ordinal {
            found = Some(limit);
        }
    }
    Ok(found)
}

/// What a process joining a shared GPU says of itself.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ShareOptions {
    /// Its soft share (default: an equal part of what others' asked shares leave).
    pub soft_share: Option<Size>,
    /// Its hard limit (default: the MPS pinned memory limit where one is set, else none).
    pub hard_limit: Option<Size>,
    /// A name for people (default: the program's).
    pub name: Option<String>,
    /// The ledgers' directory (default: [`ledger_dir::default_base`]).
    pub directory: Option<PathBuf>,
    /// The device's ledger (default: the GPU's UUID; for a simulated device
    /// `simulated-<bytes>`).
    pub device_key: Option<String>,
}

/// The options of a process as it joins a device: sizes in bytes, the hard limit's source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Terms {
    /// Its soft share in bytes.
    pub soft_share: Option<u64>,
    /// Its hard limit in bytes.
    pub hard_limit: Option<u64>,
    /// Where the hard limit comes from: `"user"`, `"mps"`, or empty.
    pub hard_limit_from: &'static str,
}

impl ShareOptions {
    /// The options in the environment: `RRMM_SHARE_SOFT` and `RRMM_SHARE_HARD` (sizes or
    /// percentages of the device), `RRMM_SHARE_NAME`; the directory is `RRMM_LEDGER_DIR`'s.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the variable that is not a size.
    pub fn from_env() -> Result<ShareOptions> {
        let size = |var: &'static str| -> Result<Option<Size>> {
            match std::env::var(var) {
                Ok(v) if !v.trim().is_empty() => Size::parse(&v)
                    .map(Some)
                    .map_err(|why| Error::invalid(var, why)),
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

    /// Checks the options whole, without joining or making anything, for device `ordinal`
    /// (`None`: a simulated device, read as device 0 for the MPS limit) of `total` bytes
    /// (`None`: not known here, as without a GPU: then what can be checked is: keys, units,
    /// percentages, a soft share in bytes above a hard limit in bytes).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] saying which option and why: a soft share beyond the device
    /// or above the hard limit (the user's or MPS's), an MPS limit that does not read, a
    /// device key that cannot name a directory; as [`ledger_dir::check_base`] for a
    /// directory that cannot hold ledgers.
    pub fn check(&self, ordinal: Option<usize>, total: Option<u64>) -> Result<()> {
        self.resolve(ordinal, total).map(|_| ())
    }

    /// The terms of these options on device `ordinal` of `total` bytes, once checked
    /// ([`ShareOptions::check`]).
    ///
    /// # Errors
    /// As [`ShareOptions::check`].
    pub fn terms(&self, ordinal: Option<usize>, total: u64) -> Result<Terms> {
        let (soft_share, hard) = self.resolve(ordinal, Some(total))?;
        let (hard_limit, hard_limit_from) = hard.map_or((None, ""), |(b, from)| (Some(b), from));
        Ok(Terms {
            soft_share,
            hard_limit,
            hard_limit_from,
        })
    }

    /// The soft share and the hard limit with its source, as far as `total` lets them be
    /// known; the checks of [`ShareOptions::check`].
    #[allow(clippy::type_complexity)]
    fn resolve(
        &self,
        ordinal: Option<usize>,
        total: Option<u64>,
    ) -> Result<(Option<u64>, Option<(u64, &'static str)>)> {
        if let Some(key) = &self.device_key {
            if !valid_key(key) {
                return Err(Error::invalid(
                    "device_key",
                    format!("{key:?} cannot name a ledger: use 1 to 64 of A-Z a-z 0-9 . _ -"),
                ));
            }
        }
        if let Some(directory) = &self.directory {
            ledger_dir::check_base(directory)?;
        }
        let mps = match std::env::var(MPS_LIMIT_VAR) {
            Ok(v) if !v.trim().is_empty() => mps_limit(&v, ordinal.unwrap_or(0))
                .map_err(|why| Error::invalid("hard_limit", why))?,
            _ => None,
        };
        let soft = self.soft_share.and_then(|s| s.known(total));
        let hard = match (self.hard_limit, mps) {
            (Some(user), _) => user.known(total).map(|b| (b, "user")),
            (None, Some(limit)) => Some((limit, "mps")),
            (None, None) => None,
        };
        if let (Some(soft), Some(total)) = (soft, total) {
            if soft > total {
                return Err(Error::invalid(
                    "soft_share",
                    format!(
                        "soft_share={} is {soft} bytes, more than the device's {total}",
                        self.soft_share.map_or(String::new(), |s| s.to_string())
                    ),
                ));
            }
        }
        if let (Some(soft), Some((hard, from))) = (soft, hard) {
            if soft > hard {
                return Err(Error::invalid(
                    "soft_share",
                    format!(
                        "a soft share of {soft} bytes is above the hard limit of {hard} bytes \
                         (from {})",
                        if from == "mps" {
                            MPS_LIMIT_VAR
                        } else {
                            "hard_limit"
                        }
                    ),
                ));
            }
        }
        Ok((soft, hard))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mps_limits_are_read_per_device_as_mps_writes_them() {
        assert_eq!(mps_limit("2G", 0), Ok(Some(2 << 30)));
        assert_eq!(mps_limit("0=1G,1=512M", 1), Ok(Some(512 << 20)));
        assert_eq!(
            mps_limit("0=1G,1=512MB", 1),
            Ok(Some(512 << 20)),
            "NVIDIA's example"
        );
        assert_eq!(mps_limit("100MB", 0), Ok(Some(100 << 20)));
        assert_eq!(mps_limit("0=1G,1=512M", 2), Ok(None));
        assert_eq!(mps_limit("1048576", 3), Ok(Some(1 << 20)));
        for bad in [
            "lots",
            "1.5G",
            "99999999999T",
            "G",
            "1X",
            "0=1G,x=2G",
            "0=1.5G",
            "-1G",
        ] {
            let why = mps_limit(bad, 0).unwrap_err();
            assert!(why.contains(MPS_LIMIT_VAR), "{bad}: {why}");
        }
    }

    #[test]
    fn sizes_are_bytes_or_percentages() {
        assert_eq!(parse_size("25%", 1000), Some(250));
        assert_eq!(parse_size("10GiB", 0), Some(10 << 30));
        assert_eq!(parse_size("3 kb", 0), Some(3000));
        assert_eq!(
            parse_size("4G", 0),
            None,
            "a bare unit, as everywhere in rrmm"
        );
        assert_eq!(parse_size("101%", 1000), None);
        assert!(Size::parse("150%").unwrap_err().contains("0% to 100%"));
        assert_eq!(Size::parse(" 50 % "), Ok(Size::Percent(50.0)));
    }

    #[test]
    fn options_are_checked_whole_with_or_without_the_device() {
        let soft = |s: Size| ShareOptions {
            soft_share: Some(s),
            ..ShareOptions::default()
        };
        assert!(soft(Size::Percent(100.0)).check(None, Some(1000)).is_ok());
        assert!(soft(Size::Bytes(1000)).check(None, Some(1000)).is_ok());
        let e = soft(Size::Bytes(1001)).check(None, Some(1000)).unwrap_err();
        assert!(e.to_string().contains("more than the device"), "{e}");
        assert!(
            soft(Size::Bytes(1001)).check(None, None).is_ok(),
            "unknown device"
        );
        let above = ShareOptions {
            hard_limit: Some(Size::Bytes(100)),
            ..soft(Size::Bytes(200))
        };
        for total in [None, Some(1000)] {
            let e = above.check(None, total).unwrap_err().to_string();
            assert!(e.contains("above the hard limit"), "{e}");
        }
        let percents = ShareOptions {
            hard_limit: Some(Size::Percent(10.0)),
            ..soft(Size::Percent(20.0))
        };
        assert!(
            percents.check(None, None).is_ok(),
            "not known without the device"
        );
        assert!(percents.check(None, Some(1000)).is_err());
        let key = ShareOptions {
            device_key: Some("../x".into()),
            ..ShareOptions::default()
        };
        assert!(key
            .check(None, None)
            .unwrap_err()
            .to_string()
            .contains("cannot name"));
        let terms = ShareOptions {
            hard_limit: Some(Size::Percent(50.0)),
            ..soft(Size::Bytes(100))
        }
        .terms(Some(0), 1000)
        .unwrap();
        assert_eq!(
            terms,
            Terms {
                soft_share: Some(100),
                hard_limit: Some(500),
                hard_limit_from: "user"
            }
        );
    }
}
