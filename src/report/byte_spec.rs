//! The one size grammar of rrmm (RMM's `parse_bytes`): Python's arguments, the command line
//! and the environment read sizes through it.

/// Why a text is not a size ([`read_byte_spec`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotASize {
    /// It does not follow the grammar.
    Unparsable,
    /// It does, but the size is larger than `usize::MAX` bytes.
    TooLarge,
}

/// Parses a byte specification as RMM's `parse_bytes`: `^([0-9]+(?:\.[0-9]*)?)[\t ]*
/// ((?i:(?:[kmgtp]i?)?b))?$`; `kb` is 1000 and `kib` 1024 bytes. The one size grammar of rrmm,
/// the command line's included, and the environment's (`RRMM_SHARE_SOFT`). A bare unit (`2k`,
/// `4G`) is refused, as RMM's tests require.
///
/// # Errors
/// [`NotASize`], saying why a text is not a size.
pub fn read_byte_spec(text: &str) -> Result<usize, NotASize> {
    let s = text.strip_suffix('\n').unwrap_or(text);
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    if digits_end == 0 {
        return Err(NotASize::Unparsable);
    }
    let mut end = digits_end;
    let mut fraction = "";
    if s[end..].starts_with('.') {
        let rest = &s[end + 1..];
        let frac_len = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        fraction = &rest[..frac_len];
        end += 1 + frac_len;
    }
    let number = &s[..end];
    let unit = s[end..]
        .trim_start_matches([' ', '\t'])
        .to_ascii_lowercase();
    let multiplier: u128 = match unit.as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "pb" => 1_000_000_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        "pib" => 1 << 50,
        _ => return Err(NotASize::Unparsable),
    };
    // The digits are digits: a whole number that does not parse is too large for a u128.
    let value: u128 = if fraction.trim_end_matches('0').is_empty() {
        let whole: u128 = s[..digits_end].parse().map_err(|_| NotASize::TooLarge)?;
        whole.checked_mul(multiplier).ok_or(NotASize::TooLarge)?
    } else {
        let x: f64 = number.parse().map_err(|_| NotASize::Unparsable)?;
        // Saturates: a product beyond u128 is too large all the same.
        (x * multiplier as f64) as u128
    };
    usize::try_from(value).map_err(|_| NotASize::TooLarge)
}

/// What a device size of `bytes` that is too small to be meant likely meant: the same number of
/// GiB (`--simulate 80` for an 80 GiB device), said as `80GiB`; `None` where that would be no
/// plausible device (`bytes` of 2**20 or more, already a MiB at least).
pub fn likely_meant_device(bytes: usize) -> Option<String> {
    (bytes > 0 && bytes < 1 << 20).then(|| format!("{bytes}GiB"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_tiny_device_was_likely_meant_in_gib() {
        assert_eq!(super::likely_meant_device(80).as_deref(), Some("80GiB"));
        assert_eq!(super::likely_meant_device(0), None);
        assert_eq!(super::likely_meant_device(1 << 20), None);
    }
}
