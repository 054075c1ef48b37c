//! An exclusive lock on an open file (`flock`), held until the guard drops: what several
//! processes take around a read-modify-write of one small file (a shared simulated device's
//! table, [`crate::shared_gpu::simulated_device`]).
//!
//! `flock` locks belong to the open file description: two descriptors opened separately, in one
//! process or in two, exclude each other; the lock goes when the guard drops or the process
//! dies (a dead process never leaves the file locked).

use std::fs::File;
use std::os::fd::AsRawFd;

/// The lock on a file, held until it drops.
#[derive(Debug)]
pub struct FileLock<'a> {
    file: &'a File,
}

impl<'a> FileLock<'a> {
    /// Waits for the exclusive lock on `file`. The holders are other processes' short
    /// read-modify-writes of the file (no holder waits on anything while it holds it).
    ///
    /// # Errors
    /// The system's error (a file system without locks).
    pub fn exclusive(file: &'a File) -> std::io::Result<FileLock<'a>> {
        loop {
            // SAFETY: `file` is open for the lifetime of the guard, so its descriptor is valid;
            // flock reads no memory of this process.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
            if rc == 0 {
                return Ok(FileLock { file });
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

impl Drop for FileLock<'_> {
    fn drop(&mut self) {
        // SAFETY: as in `exclusive`: the descriptor is open while the guard lives.
        let _ = unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_UN) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_descriptors_of_one_file_exclude_each_other() {
        let path = std::env::temp_dir().join(format!("rrmm-flock-{}", std::process::id()));
        let (a, b) = (File::create(&path).unwrap(), File::open(&path).unwrap());
        let held = FileLock::exclusive(&a).unwrap();
        // SAFETY: `b` is open; a non-blocking try reads no memory.
        let busy = unsafe { libc::flock(b.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        assert_eq!(busy, -1, "the other descriptor is locked out");
        drop(held);
        let again = FileLock::exclusive(&b).unwrap();
        drop(again);
        let _ = std::fs::remove_file(path);
    }
}
