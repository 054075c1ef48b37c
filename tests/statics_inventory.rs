//! Every process-wide `static` in `src/` (a `static` item, a `thread_local!` one, a `OnceLock`
//! or `LazyLock` one) outside test code states why it is process-wide: a
//! `// Why process-wide: ...` line just above it (above its doc comment and attributes, or
//! between them and the item), and a row in docs/design.md's "Process-wide state" table naming
//! it and its file. A new static fails here until it says why it must exist.

use std::fs;
use std::path::{Path, PathBuf};

/// The marker line a static needs just above it.
const MARKER: &str = "// Why process-wide:";

/// One `static` declaration found in the source.
#[derive(Debug)]
struct Static {
    /// The file, relative to the crate root (`src/...`).
    file: String,
    /// 1-based line of the declaration.
    line: usize,
    name: String,
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Files that hold only test code (declared behind `#[cfg(test)]` by their parents).
fn is_test_file(relative: &str) -> bool {
    relative.ends_with("/tests.rs") || relative == "src/test_support.rs"
}

/// `text` with comments, string literals and character literals blanked out (each character
/// becomes a space, newlines stay), so that braces and `static` are only seen in code.
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !ident_before(&chars, i) {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= chars.len() {
                    break;
                }
                if chars[j] == '"' && (0..hashes).all(|k| chars.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            for &ch in &chars[i..j.min(chars.len())] {
                out.push(blank(ch));
            }
            i = j;
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < chars.len() {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{..}') or a lifetime ('a, 'static).
            if next == Some('\\') {
                let mut j = i + 2;
                while j < chars.len() && chars[j] != '\'' {
                    j += 1;
                }
                for _ in i..=j.min(chars.len() - 1) {
                    out.push(' ');
                }
                i = j + 1;
            } else if chars.get(i + 2) == Some(&'\'') {
                out.push_str("   ");
                i += 3;
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// Whether the character before `i` continues an identifier (so `r` at `i` is not a prefix).
fn ident_before(chars: &[char], i: usize) -> bool {
    i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')
}

/// For each line of `code` (comments and literals blanked), whether it is test code: inside
/// an item marked `#[cfg(test)]`.
fn test_lines(code: &str) -> Vec<bool> {
    let lines: Vec<&str> = code.lines().collect();
    let mut test = vec![false; lines.len()];
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim_start().starts_with("#[cfg(test)]") {
            let start = i;
            let mut depth: i64 = 0;
            let mut opened = false;
            let mut j = i;
            'item: while j < lines.len() {
                let text = if j == start {
                    lines[j].trim_start().trim_start_matches("#[cfg(test)]")
                } else {
                    lines[j]
                };
                for ch in text.chars() {
                    match ch {
                        '{' => {
                            depth += 1;
                            opened = true;
                        }
                        '}' => depth -= 1,
                        ';' if !opened && depth == 0 => break 'item,
                        _ => {}
                    }
                }
                if opened && depth <= 0 {
                    break;
                }
                j += 1;
            }
            let end = j.min(lines.len() - 1);
            for flag in &mut test[start..=end] {
                *flag = true;
            }
            i = end + 1;
        } else {
            i += 1;
        }
    }
    test
}

/// The name declared by a `static` on this line of code, if any (`static NAME:`, not
/// `&'static`).
fn static_name(code_line: &str) -> Option<String> {
    let bytes = code_line.as_bytes();
    let mut from = 0;
    while let Some(pos) = code_line[from..].find("static") {
        let at = from + pos;
        from = at + 6;
        let before_ok =
            at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || b"_'".contains(&bytes[at - 1]));
        let rest = &code_line[at + 6..];
        if !before_ok || !rest.starts_with(char::is_whitespace) {
            continue;
        }
        let rest = rest.trim_start();
        let rest = rest
            .strip_prefix("mut ")
            .map(str::trim_start)
            .unwrap_or(rest);
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() && rest[name.len()..].trim_start().starts_with(':') {
            return Some(name);
        }
    }
    None
}

/// Every static outside test code in `src/`, with whether it has the marker above it.
fn inventory() -> Vec<(Static, bool)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    files.sort();
    let mut found = Vec::new();
    for path in files {
        let relative = path
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        if is_test_file(&relative) {
            continue;
        }
        let text = fs::read_to_string(&path).unwrap();
        let raw: Vec<&str> = text.lines().collect();
        let code = code_only(&text);
        let code_lines: Vec<&str> = code.lines().collect();
        let test = test_lines(&code);
        for (n, line) in code_lines.iter().enumerate() {
            if test[n] {
                continue;
            }
            let Some(name) = static_name(line) else {
                continue;
            };
            found.push((
                Static {
                    file: relative.clone(),
                    line: n + 1,
                    name,
                },
                has_marker(&raw, n),
            ));
        }
    }
    found
}

/// Whether the lines just above line `n` (comments, doc comments, attributes, a
/// `thread_local! {` opener) hold the marker.
fn has_marker(raw: &[&str], n: usize) -> bool {
    let mut i = n;
    while i > 0 {
        i -= 1;
        let line = raw[i].trim();
        if line.starts_with(MARKER) {
            return true;
        }
        let above = line.starts_with("//")
            || line.starts_with("#[")
            || line.ends_with("thread_local! {")
            || line.ends_with("thread_local!{");
        if !above {
            return false;
        }
    }
    false
}

#[test]
fn every_static_says_why_it_is_process_wide() {
    let found = inventory();
    // The scan itself works: the crate has statics (the driver's state among them).
    assert!(
        found
            .iter()
            .any(|(s, _)| s.file == "src/cuda/driver.rs" && s.name == "STATE"),
        "the scan found no static in src/cuda/driver.rs: {found:?}"
    );
    let missing: Vec<String> = found
        .iter()
        .filter(|(_, marked)| !marked)
        .map(|(s, _)| format!("{}:{} {}", s.file, s.line, s.name))
        .collect();
    assert!(
        missing.is_empty(),
        "statics without a `{MARKER}` line just above them:\n{}",
        missing.join("\n")
    );
}

#[test]
fn every_static_is_listed_in_the_design() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let design = fs::read_to_string(root.join("docs/design.md")).unwrap();
    let section = design
        .split("\n## ")
        .find(|s| s.starts_with("Process-wide state"))
        .expect("docs/design.md has a \"Process-wide state\" section");
    let unlisted: Vec<String> = inventory()
        .iter()
        .filter(|(s, _)| {
            let name = format!("`{}`", s.name);
            !section
                .lines()
                .any(|row| row.contains(&name) && row.contains(&s.file))
        })
        .map(|(s, _)| format!("{} in {}", s.name, s.file))
        .collect();
    assert!(
        unlisted.is_empty(),
        "statics without a row (name and file) in docs/design.md's \"Process-wide state\":\n{}",
        unlisted.join("\n")
    );
}

#[test]
fn the_scan_sees_statics_and_skips_tests_and_literals() {
    let text = "static A: u8 = 0;\n\
                fn f() -> &'static str { \"static B: u8\" }\n\
                // static C: u8\n\
                thread_local! {\n    static D: u8 = 0;\n}\n\
                #[cfg(test)]\nmod tests {\n    static E: u8 = 0;\n    fn g() { let _ = '{'; }\n}\n\
                static F: u8 = 1;\n";
    let code = code_only(text);
    let test = test_lines(&code);
    let names: Vec<String> = code
        .lines()
        .enumerate()
        .filter(|(n, _)| !test[*n])
        .filter_map(|(_, l)| static_name(l))
        .collect();
    assert_eq!(names, ["A", "D", "F"]);
}
