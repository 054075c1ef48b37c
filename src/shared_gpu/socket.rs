//! The transport between processes of a ledger: one Unix datagram socket per member, in the
//! ledger's directory (only its user can reach it).
//!
//! - Sends never block: the socket is non-blocking, so a receiver whose queue is full (a
//!   process stopped, or one that never reads) or that is gone makes the send fail at once
//!   ([`SendError`]); the caller records it and goes on.
//! - Receiving waits at most a given time, and says who sent each datagram as the kernel knows
//!   it (`SO_PASSCRED`: the sender's pid and uid, [`Credentials`], which a process cannot forge
//!   without privilege) and where to answer (the sender's bound path, if any).
//!
//! The calls the standard library does not wrap (`setsockopt`, `poll`, `recvmsg` with its
//! control messages) are here, the only `unsafe` of the shared GPU's code.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Who sent a datagram, as the kernel names it to this process: its pid in this process's pid
/// namespace (0 when that namespace cannot see it) and its uid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Credentials {
    /// The sender's process id as this process's namespace sees it.
    pub pid: u32,
    /// The sender's user id.
    pub uid: u32,
}

/// One datagram received.
#[derive(Debug)]
pub struct Received {
    /// Its bytes.
    pub bytes: Vec<u8>,
    /// Its sender, as the kernel names it (`None`: the kernel attached no credentials).
    pub sender: Option<Credentials>,
    /// Where an answer goes: the path the sender's socket is bound to (`None`: an unbound or
    /// abstract socket, which cannot be answered).
    pub reply_to: Option<PathBuf>,
}

/// Why a datagram was not sent.
#[derive(Debug)]
pub enum SendError {
    /// The receiver's queue is full: it does not read (stopped, slow, or never).
    Full,
    /// Nobody receives there (the process is gone, or the path is no socket).
    Gone,
    /// Another error.
    Other(io::Error),
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Full => f.write_str("its queue is full (it does not read: stopped?)"),
            SendError::Gone => f.write_str("nobody receives there (gone)"),
            SendError::Other(e) => write!(f, "{e}"),
        }
    }
}

impl From<io::Error> for SendError {
    fn from(e: io::Error) -> SendError {
        match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::ENOBUFS) => SendError::Full,
            Some(libc::ENOENT) | Some(libc::ECONNREFUSED) | Some(libc::ENOTSOCK) => SendError::Gone,
            _ if e.kind() == io::ErrorKind::WouldBlock => SendError::Full,
            _ => SendError::Other(e),
        }
    }
}

/// A member's socket.
#[derive(Debug)]
pub struct LedgerSocket {
    socket: UnixDatagram,
}

impl LedgerSocket {
    /// Binds a socket at `path` (a socket left there by a process that died is replaced),
    /// non-blocking, receiving its senders' credentials.
    ///
    /// # Errors
    /// The I/O error.
    pub fn bind(path: &Path) -> io::Result<LedgerSocket> {
        let _ = std::fs::remove_file(path);
        let socket = UnixDatagram::bind(path)?;
        socket.set_nonblocking(true)?;
        let on: libc::c_int = 1;
        // SAFETY: the descriptor is this socket's, open for the call; `on` is a c_int that
        // lives across it, and its size is passed.
        let rc = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PASSCRED,
                (&on as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(LedgerSocket { socket })
    }

    /// Sends `bytes` to the socket at `path`, without waiting.
    ///
    /// # Errors
    /// [`SendError`]: full, gone, or another I/O error.
    pub fn send_to(&self, bytes: &[u8], path: &Path) -> Result<(), SendError> {
        self.socket.send_to(bytes, path)?;
        Ok(())
    }

    /// Waits up to `wait` for a datagram of at most `max` bytes; `None` when none came (a
    /// longer one is dropped, as `None`).
    ///
    /// # Errors
    /// The I/O error of `poll` or `recvmsg`.
    pub fn receive(&self, max: usize, wait: Duration) -> io::Result<Option<Received>> {
        let fd = self.socket.as_raw_fd();
        let mut poll = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let millis = wait.as_millis().min(i32::MAX as u128) as libc::c_int;
        // SAFETY: one valid pollfd, living across the call, and its count.
        let ready = unsafe { libc::poll(&mut poll, 1, millis) };
        if ready < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(None)
            } else {
                Err(e)
            };
        }
        if ready == 0 {
            return Ok(None);
        }
        let mut bytes = vec![0u8; max + 1];
        let mut iov = libc::iovec {
            iov_base: bytes.as_mut_ptr().cast(),
            iov_len: bytes.len(),
        };
        // SAFETY: all-zero is a valid value of these plain C structs.
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        // Room for one SCM_CREDENTIALS message (CMSG_SPACE of a ucred is 32 bytes), aligned
        // as a cmsghdr.
        let mut control = [0u64; 8];
        // SAFETY: as above.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_name = (&mut addr as *mut libc::sockaddr_un).cast();
        msg.msg_namelen = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control) as _;
        // SAFETY: `msg` points at `iov` (over `bytes`), `addr` and `control`, each living
        // across the call with the sizes given; the kernel writes within them.
        let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
                _ => Err(e),
            };
        }
        let sender = credentials(&msg);
        if msg.msg_flags & libc::MSG_TRUNC != 0 || n as usize > max {
            return Ok(None);
        }
        bytes.truncate(n as usize);
        let path_len = (msg.msg_namelen as usize)
            .saturating_sub(std::mem::size_of::<libc::sa_family_t>())
            .min(addr.sun_path.len());
        let path: Vec<u8> = addr.sun_path[..path_len].iter().map(|&c| c as u8).collect();
        Ok(Some(Received {
            bytes,
            sender,
            reply_to: bound_path(&path),
        }))
    }
}

/// The credentials among the control messages `recvmsg` filled in `msg`.
fn credentials(msg: &libc::msghdr) -> Option<Credentials> {
    // SAFETY: `msg` was filled by `recvmsg`: its control pointer and length describe the
    // control messages the kernel wrote, which CMSG_FIRSTHDR/CMSG_NXTHDR walk within.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(msg) };
    while !cmsg.is_null() {
        // SAFETY: a non-null header returned by CMSG_FIRSTHDR/NXTHDR lies within the buffer.
        let header = unsafe { &*cmsg };
        // SAFETY: CMSG_LEN only computes a length from its argument.
        let ucred_len = unsafe { libc::CMSG_LEN(std::mem::size_of::<libc::ucred>() as u32) };
        if header.cmsg_level == libc::SOL_SOCKET
            && header.cmsg_type == libc::SCM_CREDENTIALS
            && header.cmsg_len as usize >= ucred_len as usize
        {
            // SAFETY: the header says its data holds a ucred; the data may be unaligned for
            // it, hence the unaligned read.
            let ucred: libc::ucred =
                unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast()) };
            return Some(Credentials {
                pid: u32::try_from(ucred.pid).unwrap_or(0),
                uid: ucred.uid,
            });
        }
        // SAFETY: as for CMSG_FIRSTHDR; `cmsg` is a header of this message.
        cmsg = unsafe { libc::CMSG_NXTHDR(msg, cmsg) };
    }
    None
}

/// The path in the bytes of a `sun_path` of that length: `None` for an unbound socket (no
/// bytes) or an abstract one (a first byte 0).
fn bound_path(sun_path: &[u8]) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let end = sun_path
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(sun_path.len());
    (end > 0).then(|| PathBuf::from(std::ffi::OsStr::from_bytes(&sun_path[..end])))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("rrmm-sock-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn bound_paths_are_read_and_unbound_or_abstract_ones_are_none() {
        assert_eq!(
            bound_path(b"/tmp/a.sock\0\0\0"),
            Some(PathBuf::from("/tmp/a.sock"))
        );
        assert_eq!(
            bound_path(b"/tmp/b.sock"),
            Some(PathBuf::from("/tmp/b.sock"))
        );
        assert_eq!(bound_path(b""), None);
        assert_eq!(bound_path(b"\0abstract"), None);
    }

    #[test]
    fn a_datagram_says_who_sent_it_and_where_to_answer() {
        let dir = temp_dir("creds");
        let a = LedgerSocket::bind(&dir.join("a.sock")).unwrap();
        let b = LedgerSocket::bind(&dir.join("b.sock")).unwrap();
        b.send_to(b"hello", &dir.join("a.sock")).unwrap();
        let got = a.receive(64, Duration::from_secs(5)).unwrap().unwrap();
        assert_eq!(got.bytes, b"hello");
        assert_eq!(got.reply_to, Some(dir.join("b.sock")));
        let me = got.sender.unwrap();
        assert_eq!(me.pid, std::process::id());
        assert_eq!(me.uid, rustix::process::getuid().as_raw());
        // Unbound: no address to answer.
        let unbound = UnixDatagram::unbound().unwrap();
        unbound.send_to(b"x", dir.join("a.sock")).unwrap();
        let got = a.receive(64, Duration::from_secs(5)).unwrap().unwrap();
        assert_eq!(
            (got.reply_to, got.sender.map(|c| c.pid)),
            (None, Some(std::process::id()))
        );
        // Too long: dropped.
        b.send_to(&[7u8; 100], &dir.join("a.sock")).unwrap();
        assert!(a.receive(64, Duration::from_secs(5)).unwrap().is_none());
        assert!(
            a.receive(64, Duration::from_millis(10)).unwrap().is_none(),
            "nothing: waits"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn sends_to_a_full_or_missing_receiver_fail_at_once() {
        let dir = temp_dir("full");
        let a = LedgerSocket::bind(&dir.join("a.sock")).unwrap();
        let _never_read = LedgerSocket::bind(&dir.join("never.sock")).unwrap();
        let started = std::time::Instant::now();
        let mut full = 0;
        for _ in 0..1000 {
            if let Err(SendError::Full) = a.send_to(b"x", &dir.join("never.sock")) {
                full += 1;
            }
        }
        assert!(
            full > 900,
            "the receiver's queue holds a few: the rest fail"
        );
        assert!(matches!(
            a.send_to(b"x", &dir.join("nobody.sock")),
            Err(SendError::Gone)
        ));
        std::fs::write(dir.join("file.sock"), b"").unwrap();
        assert!(matches!(
            a.send_to(b"x", &dir.join("file.sock")),
            Err(SendError::Gone)
        ));
        assert!(started.elapsed() < Duration::from_secs(2), "never waits");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
