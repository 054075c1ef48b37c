//! Every resource type the crate defines (each `impl MemoryResource for ...`,
//! `forward_memory_resource!(...)` and `pool_resource!(...)` in `src/`, outside test code, and
//! each alias of `DirectMemoryResource`) is driven by both the conformance suite
//! (`tests/conformance.rs`, on the CPU or ignored without a GPU) and the Python API's Hypothesis
//! state machine (`tests/python/test_api_state_machine.py`, in its classes or its GPU-only
//! table), or is named below with the reason it cannot be. A new resource fails here until both
//! know it.

use std::fs;
use std::path::{Path, PathBuf};

/// Not in the conformance suite, with the reason.
const NOT_IN_CONFORMANCE: &[(&str, &str)] = &[(
    "PeerMemoryResource",
    "needs two GPUs with a peer link: tests/python/test_peer_tier.py drives it on two GPUs, \
     and the tiers that use it run on simulated devices",
)];

/// Not in the Python state machine, with the reason.
const NOT_IN_THE_MACHINE: &[(&str, &str)] = &[
    (
        "CheckedResourceAdaptor",
        "Python puts it in front of every source resource itself (no class of its own): the \
         machine's source resources are driven through it",
    ),
    (
        "UncachedManagedMemoryResource",
        "Rust's cuMemAllocManaged without a cache; Python's ManagedMemoryResource is the cache \
         over it (in the machine's GPU-only table)",
    ),
];

/// Internal types that implement the trait but are no resource of the crate's API.
const INTERNAL: &[&str] = &["StreamOrderedCore", "DirectMemoryResource"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs")
            && !path.ends_with("tests.rs")
            && !path.to_string_lossy().contains("/tests/")
        {
            out.push(path);
        }
    }
}

/// The identifier at the start of `text` (letters, digits, `_`).
fn ident(text: &str) -> &str {
    let end = text
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    &text[..end]
}

/// Every resource type defined in `src/` outside test modules.
fn resource_types() -> Vec<String> {
    let mut files = Vec::new();
    rust_files(Path::new("src"), &mut files);
    let mut found = Vec::new();
    for file in files {
        let text = fs::read_to_string(&file).unwrap();
        // Test modules come last in a file: from `mod tests` on is not the API.
        let code = text.split("\nmod tests").next().unwrap_or("");
        for line in code.lines() {
            let line = line.trim();
            let name = if let Some(rest) = line.split(" MemoryResource for ").nth(1) {
                if !line.starts_with("impl") {
                    continue;
                }
                ident(rest)
            } else if let Some(rest) = line
                .strip_prefix("forward_memory_resource!(")
                .or_else(|| line.strip_prefix("pool_resource!("))
            {
                ident(rest)
            } else if let Some(rest) = line.strip_prefix("pub type ") {
                if !line.contains("= DirectMemoryResource<") {
                    continue;
                }
                ident(rest)
            } else {
                continue;
            };
            if !name.is_empty() && !name.starts_with('$') && !found.iter().any(|f| f == name) {
                found.push(name.to_string());
            }
        }
        // `pool_resource!(` with the type on the next line.
        let mut lines = code.lines().map(str::trim).peekable();
        while let Some(line) = lines.next() {
            if line == "pool_resource!(" || line == "forward_memory_resource!(" {
                if let Some(next) = lines.peek() {
                    let name = ident(next);
                    if !name.is_empty() && !found.iter().any(|f| f == name) {
                        found.push(name.to_string());
                    }
                }
            }
        }
    }
    found.retain(|n| n != "Arc" && !INTERNAL.contains(&n.as_str()));
    found.sort();
    found
}

/// Whether `word` appears in `text` as a whole word.
fn names(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + word.len()..].chars().next();
        let edge = |c: Option<char>| !c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        edge(before) && edge(after)
    })
}

#[test]
fn every_resource_type_is_in_the_conformance_suite_and_the_state_machine() {
    let types = resource_types();
    for expected in [
        "PoolMemoryResource",
        "TieredMemoryResource",
        "CudaMemoryResource",
        "CudaAsyncViewMemoryResource",
        "PinnedHostMemoryResource",
        "CallbackMemoryResource",
    ] {
        assert!(
            types.iter().any(|t| t == expected),
            "{expected} not found: {types:?}"
        );
    }
    let conformance = fs::read_to_string("tests/conformance.rs").unwrap();
    let machine = fs::read_to_string("tests/python/test_api_state_machine.py").unwrap();
    let mut missing = Vec::new();
    for t in &types {
        let exempt = |list: &[(&str, &str)]| list.iter().any(|(n, _)| n == t);
        if !names(&conformance, t) && !exempt(NOT_IN_CONFORMANCE) {
            missing.push(format!("{t}: not in tests/conformance.rs"));
        }
        if !names(&machine, t) && !exempt(NOT_IN_THE_MACHINE) {
            missing.push(format!("{t}: not in the API state machine"));
        }
    }
    for (t, _) in NOT_IN_CONFORMANCE.iter().chain(NOT_IN_THE_MACHINE) {
        assert!(
            types.iter().any(|x| x == t),
            "{t} is exempted but no longer exists"
        );
    }
    assert!(missing.is_empty(), "{missing:#?}");
}
