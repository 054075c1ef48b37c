//! Real processes: this test binary runs itself as the other process ([`helper`], which does
//! nothing unless `RRMM_SHARE_HELPER` names its role), and the two talk over the exporter's
//! socket. Lines the helper prints (`READY`, `HELD`, `HASH <name> <hash>`) tell the test where
//! it is.

use super::super::*;
use super::{bytes_at, pattern, TempLedger};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

const ROLE: &str = "RRMM_SHARE_HELPER";
const PATH: &str = "RRMM_SHARE_PATH";
const NAMES: &str = "RRMM_SHARE_NAMES";

/// FNV-1a of `bytes`.
fn hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The names the helper exporter exports: `n<i>` holds `pattern(i)`, 64 KiB each, four per
/// segment.
fn exported_names() -> Vec<String> {
    (0..8).map(|i| format!("n{i}")).collect()
}

/// Starts this test binary as a helper of `role`.
fn spawn(role: &str, path: &Path, names: &[String]) -> (Child, BufReader<ChildStdout>) {
    spawn_as(role, path, names, None)
}

/// Starts this test binary as a helper of `role`, as user and group `user` where given.
fn spawn_as(
    role: &str,
    path: &Path,
    names: &[String],
    user: Option<u32>,
) -> (Child, BufReader<ChildStdout>) {
    let mut command = Command::new(std::env::current_exe().unwrap());
    if let Some(id) = user {
        use std::os::unix::process::CommandExt;
        command.uid(id).gid(id);
    }
    let mut child = command
        .args([
            "--exact",
            "shared_memory::tests::processes::helper",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, role)
        .env(PATH, path)
        .env(NAMES, names.join(","))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    (child, out)
}

/// Reads the helper's lines until one starts with `word`; the lines read.
fn until(out: &mut BufReader<ChildStdout>, word: &str) -> Vec<String> {
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the helper ended before {word}: {lines:?}"
        );
        let done = line.starts_with(word);
        lines.push(line.trim_end().to_string());
        if done {
            return lines;
        }
    }
}

fn kill(child: &mut Child) {
    // SIGKILL (what `Child::kill` sends): the process gets no chance to say goodbye.
    child.kill().unwrap();
    let _ = child.wait();
}

/// The other process. Does nothing when run as an ordinary test.
#[test]
fn helper() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let path = std::path::PathBuf::from(std::env::var(PATH).unwrap());
    let names: Vec<String> = std::env::var(NAMES)
        .unwrap_or_default()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    let wait = Duration::from_secs(60);
    // The test harness printed `test ... ` without a line's end: the markers start lines.
    println!();
    match role.as_str() {
        "exporter" => {
            let exp = Exporter::start(&path, ExportOptions::default()).unwrap();
            let mut segment = 0;
            for (i, name) in exported_names().iter().enumerate() {
                if i % 4 == 0 {
                    segment = exp.add_segment(MemfdSegment::new(4 << 16, true).unwrap());
                }
                let offset = (i as u64 % 4) << 16;
                let seg = exp.segment(segment).unwrap();
                seg.host()
                    .unwrap()
                    .write(offset, &pattern(i as u64, 1 << 16))
                    .unwrap();
                exp.publish(name, bytes_at(segment, offset, 1 << 16, false))
                    .unwrap();
            }
            println!("READY");
            std::thread::sleep(wait);
        }
        "reader" => {
            let mut imp = Attachment::attach(&path, AttachOptions::default()).unwrap();
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            for r in imp.resolve_many(&refs).unwrap() {
                println!("HASH {} {}", r.name, hash(&imp.read(&r).unwrap()));
            }
            println!("SEGMENTS {}", imp.segments());
            println!("DONE");
        }
        "holder" => {
            let mut imp = Attachment::attach(&path, AttachOptions::default()).unwrap();
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            imp.resolve_many(&refs).unwrap();
            println!("HELD");
            std::thread::sleep(wait);
        }
        "stranger" => {
            let outcome = match Attachment::attach(&path, AttachOptions::default()) {
                Ok(_) => "attached".to_string(),
                Err(e) => format!("{e:?}"),
            };
            println!("OUTCOME {outcome}");
        }
        other => panic!("no helper role {other}"),
    }
}

#[test]
fn three_importers_in_other_processes_read_the_exporters_bytes_bit_exact() {
    let ledger = TempLedger::new("readers");
    let exp = Exporter::in_ledger(&ledger.dir, "e", ExportOptions::default()).unwrap();
    let mut expected = Vec::new();
    for s in 0..3u64 {
        let seg = MemfdSegment::new(4 << 20, true).unwrap();
        seg.host_map().write(0, &pattern(100 + s, 4 << 20)).unwrap();
        let seg = exp.add_segment(seg);
        for k in 0..5u64 {
            let name = format!("s{s}-{k}");
            let (offset, size) = (k * (800 << 10) + 13, 700 << 10);
            exp.publish(&name, bytes_at(seg, offset, size, false))
                .unwrap();
            let bytes = &pattern(100 + s, 4 << 20)[offset as usize..(offset + size) as usize];
            expected.push(format!("HASH {name} {}", hash(bytes)));
        }
    }
    let names: Vec<String> = exp.names();
    let mut children: Vec<_> = (0..3)
        .map(|_| spawn("reader", &ledger.path("e"), &names))
        .collect();
    for (child, out) in &mut children {
        let lines = until(out, "DONE");
        let hashes: Vec<String> = lines
            .iter()
            .filter(|l| l.starts_with("HASH "))
            .cloned()
            .collect();
        assert_eq!(hashes, expected, "bit-exact in another process");
        assert!(lines.contains(&"SEGMENTS 3".to_string()), "{lines:?}");
        assert!(child.wait().unwrap().success());
    }
    // Each reader exited: its leases went with it.
    assert!(exp.wait_for(Duration::from_secs(5), |f| f.leases == 0
        && f.importers == 0));
}

#[test]
fn a_killed_importer_lets_go_of_its_leases_and_the_free_runs() {
    let ledger = TempLedger::new("killed");
    let exp = Exporter::in_ledger(&ledger.dir, "e", ExportOptions::default()).unwrap();
    let seg = exp.add_segment(MemfdSegment::new(1 << 16, true).unwrap());
    exp.publish("a", bytes_at(seg, 0, 1 << 16, false)).unwrap();
    let (mut child, mut out) = spawn("holder", &ledger.path("e"), &["a".to_string()]);
    until(&mut out, "HELD");
    let freed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = freed.clone();
    let outcome = exp
        .free("a", move || {
            flag.store(true, std::sync::atomic::Ordering::SeqCst)
        })
        .unwrap();
    assert_eq!(outcome, FreeOutcome::Deferred { holders: 1 });
    assert!(!freed.load(std::sync::atomic::Ordering::SeqCst));
    kill(&mut child);
    assert!(exp.wait_for(Duration::from_secs(5), |f| f.deferred_frees == 0));
    assert!(freed.load(std::sync::atomic::Ordering::SeqCst));
}

#[test]
fn an_importer_reads_on_after_its_exporter_is_killed_and_a_new_one_adopts() {
    let ledger = TempLedger::new("adoption");
    let path = ledger.path("old");
    let (mut child, mut out) = spawn("exporter", &path, &[]);
    until(&mut out, "READY");
    let mut imp = Attachment::attach(&path, AttachOptions::default()).unwrap();
    let names = exported_names();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let resolved = imp.resolve_many(&refs).unwrap();
    assert_eq!(imp.exporter_pid(), child.id());
    kill(&mut child);
    // The exporter is gone; what this process maps is not.
    for (i, r) in resolved.iter().enumerate() {
        assert_eq!(imp.read(r).unwrap(), pattern(i as u64, 1 << 16));
    }
    assert!(matches!(imp.names(), Err(ShareError::Gone)));
    // A new exporter takes the segments back from this importer, copying nothing.
    let options = ExportOptions {
        accept_adoption: true,
        ..ExportOptions::default()
    };
    let started = Instant::now();
    let new = Exporter::in_ledger(&ledger.dir, "new", options).unwrap();
    assert_eq!(imp.hand_back(new.path()).unwrap(), (2, names.len() as u32));
    let took = started.elapsed();
    assert!(took < Duration::from_secs(1), "adoption took {took:?}");
    assert_eq!(new.names(), names);
    // Another process reads them from the new exporter, bit-exact.
    let (mut reader, mut out) = spawn("reader", new.path(), &names);
    let lines = until(&mut out, "DONE");
    for (i, name) in names.iter().enumerate() {
        let line = format!("HASH {name} {}", hash(&pattern(i as u64, 1 << 16)));
        assert!(lines.contains(&line), "{line} not in {lines:?}");
    }
    assert!(reader.wait().unwrap().success());
}

#[test]
fn another_users_process_is_refused_at_both_ends() {
    if rustix::process::getuid().as_raw() != 0 {
        eprintln!("skipped: needs root, to run a process as another user");
        return;
    }
    // A directory anyone can reach, so the socket's permissions do not stop the stranger first:
    // the peer's credentials must.
    let dir = std::env::temp_dir().join(format!("rrmm-share-open-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let path = dir.join("e.share");
    let exp = Exporter::start(&path, ExportOptions::default()).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
    let seg = exp.add_segment(MemfdSegment::new(4096, true).unwrap());
    exp.publish("a", bytes_at(seg, 0, 16, false)).unwrap();
    let (mut child, mut out) = spawn_as("stranger", &path, &[], Some(65534));
    let lines = until(&mut out, "OUTCOME");
    let outcome = lines.last().unwrap();
    assert!(
        outcome.contains("PeerUser { peer: 0, me: 65534 }"),
        "the stranger refuses this user's exporter: {outcome}"
    );
    assert!(child.wait().unwrap().success());
    // And the exporter closed the stranger's connection at once, without a word.
    assert!(exp.wait_for(Duration::from_secs(5), |f| f.other_users == 1));
    assert_eq!((exp.figures().importers, exp.figures().leases), (0, 0));
    drop(exp);
    let _ = std::fs::remove_dir_all(&dir);
}
