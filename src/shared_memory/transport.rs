//! The socket between an exporter and one importer: `SOCK_SEQPACKET` over a Unix path (one
//! message per packet, read whole or not at all), descriptors beside the bytes (`SCM_RIGHTS`),
//! the peer's user as the kernel names it (`SO_PEERCRED`).
//!
//! Every socket is non-blocking: a send or receive that cannot go on at once waits for the
//! socket with `poll` until its deadline, then fails with [`ShareError::Timeout`]; so a stopped
//! or slow peer costs a waiter at most its deadline. A receive never stops part-way (a packet
//! comes whole), so only sends and receives of answers wait. All through `rustix`: no `unsafe`.

use super::error::ShareError;
use super::message::{limits, MAX_FRAME};
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::net::{
    accept_with, bind, connect, listen, recvmsg, sendmsg, socket_with, sockopt, AddressFamily,
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// One packet received: its bytes and the descriptors beside them.
#[derive(Debug)]
pub struct Packet {
    /// The bytes.
    pub bytes: Vec<u8>,
    /// The descriptors that came with them (closed when dropped).
    pub fds: Vec<OwnedFd>,
    /// Whether descriptors were cut (more came than one message may carry); those that came
    /// are here, the rest the kernel closed.
    pub fds_cut: bool,
}

/// The peer of a connected socket as the kernel names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// Its process id in this process's pid namespace (0 when it cannot be seen from here).
    pub pid: u32,
    /// Its user.
    pub uid: u32,
}

/// This process's user.
pub fn my_uid() -> u32 {
    rustix::process::getuid().as_raw()
}

/// A connected socket.
#[derive(Debug)]
pub struct Channel {
    fd: OwnedFd,
}

fn seqpacket() -> Result<OwnedFd, ShareError> {
    socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| ShareError::io("socket", e))
}

fn address(path: &Path) -> Result<SocketAddrUnix, ShareError> {
    SocketAddrUnix::new(path).map_err(|e| {
        ShareError::invalid(
            "path",
            format!("{} cannot name a socket ({e})", path.display()),
        )
    })
}

/// Waits until `fd` is ready for `events` or `deadline` passes; the events seen.
fn wait(
    fd: BorrowedFd<'_>,
    events: PollFlags,
    deadline: Instant,
    what: &'static str,
) -> Result<PollFlags, ShareError> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ShareError::Timeout(what));
        }
        let timeout = Timespec {
            tv_sec: left.as_secs() as _,
            tv_nsec: left.subsec_nanos() as _,
        };
        let mut fds = [PollFd::from_borrowed_fd(fd, events)];
        match poll(&mut fds, Some(&timeout)) {
            Ok(0) => continue,
            Ok(_) => return Ok(fds[0].revents()),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(ShareError::io("poll", e)),
        }
    }
}

/// Whether the peer of `fd` has closed its end (a `poll` that does not wait).
fn hung_up(fd: BorrowedFd<'_>) -> bool {
    let mut fds = [PollFd::from_borrowed_fd(fd, PollFlags::IN)];
    let timeout = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    matches!(poll(&mut fds, Some(&timeout)), Ok(1))
        && fds[0]
            .revents()
            .intersects(PollFlags::HUP | PollFlags::ERR | PollFlags::RDHUP)
}

impl Channel {
    /// Connects to the socket at `path`, waiting until `deadline` while its queue of
    /// connections is full; checks that its owner is this process's user.
    ///
    /// # Errors
    /// [`ShareError::Gone`] when nobody listens there; [`ShareError::Timeout`];
    /// [`ShareError::PeerUser`] for another user's socket; the I/O error.
    pub fn connect(path: &Path, deadline: Instant) -> Result<Channel, ShareError> {
        let addr = address(path)?;
        let fd = seqpacket()?;
        loop {
            match connect(&fd, &addr) {
                Ok(()) | Err(Errno::ISCONN) => break,
                Err(Errno::AGAIN) | Err(Errno::INTR) => {
                    if Instant::now() >= deadline {
                        return Err(ShareError::Timeout("connect"));
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(Errno::CONNREFUSED) | Err(Errno::NOENT) => return Err(ShareError::Gone),
                Err(e) => return Err(ShareError::io("connect", e)),
            }
        }
        let channel = Channel { fd };
        channel.check_user()?;
        Ok(channel)
    }

    /// The peer as the kernel names it.
    ///
    /// # Errors
    /// The I/O error of `getsockopt`.
    pub fn peer(&self) -> Result<Peer, ShareError> {
        let cred =
            sockopt::socket_peercred(&self.fd).map_err(|e| ShareError::io("SO_PEERCRED", e))?;
        Ok(Peer {
            pid: u32::try_from(rustix::process::Pid::as_raw(Some(cred.pid))).unwrap_or(0),
            uid: cred.uid.as_raw(),
        })
    }

    /// Checks that the peer is this process's user.
    ///
    /// # Errors
    /// [`ShareError::PeerUser`]; as [`Channel::peer`].
    pub fn check_user(&self) -> Result<Peer, ShareError> {
        let peer = self.peer()?;
        let me = my_uid();
        if peer.uid != me {
            return Err(ShareError::PeerUser { peer: peer.uid, me });
        }
        Ok(peer)
    }

    /// Sends one packet of `bytes` with `fds` beside, waiting until `deadline` while the
    /// peer's queue is full.
    ///
    /// # Errors
    /// [`ShareError::Timeout`]; [`ShareError::Gone`] when the peer closed; the I/O error.
    pub fn send(
        &self,
        bytes: &[u8],
        fds: &[BorrowedFd<'_>],
        deadline: Instant,
    ) -> Result<(), ShareError> {
        if fds.len() > limits::SEGMENTS {
            return Err(ShareError::invalid(
                "fds",
                format!(
                    "{} descriptors, at most {} a message",
                    fds.len(),
                    limits::SEGMENTS
                ),
            ));
        }
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(limits::SEGMENTS))];
        loop {
            let mut control = SendAncillaryBuffer::new(&mut space);
            if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
                return Err(ShareError::invalid("fds", "no room for the descriptors"));
            }
            let iov = [IoSlice::new(bytes)];
            match sendmsg(
                &self.fd,
                &iov,
                &mut control,
                SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
            ) {
                Ok(_) => return Ok(()),
                Err(Errno::AGAIN) | Err(Errno::NOBUFS) => {
                    let seen = wait(self.fd.as_fd(), PollFlags::OUT, deadline, "send")?;
                    if seen.intersects(PollFlags::HUP | PollFlags::ERR) {
                        return Err(ShareError::Gone);
                    }
                }
                Err(Errno::INTR) => {}
                Err(Errno::PIPE) | Err(Errno::CONNRESET) | Err(Errno::NOTCONN) => {
                    return Err(ShareError::Gone)
                }
                Err(e) => return Err(ShareError::io("sendmsg", e)),
            }
        }
    }

    /// Receives one packet if one is there, without waiting (`None`: none yet).
    ///
    /// # Errors
    /// [`ShareError::Gone`] when the peer closed and nothing is left to read;
    /// [`ShareError::Wire`] for a packet longer than a frame (dropped); the I/O error.
    pub fn try_recv(&self) -> Result<Option<Packet>, ShareError> {
        let mut bytes = vec![0u8; MAX_FRAME + 1];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(limits::SEGMENTS))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        // A peer that closed with requests of ours unread leaves a reset, reported (once)
        // before the packets it sent: read on past it, to its last words.
        let mut reset = false;
        let got = loop {
            let got = {
                let mut iov = [IoSliceMut::new(&mut bytes)];
                recvmsg(
                    &self.fd,
                    &mut iov,
                    &mut control,
                    RecvFlags::DONTWAIT | RecvFlags::CMSG_CLOEXEC,
                )
            };
            match got {
                Ok(got) => break got,
                Err(Errno::AGAIN) | Err(Errno::INTR) if !reset => return Ok(None),
                Err(Errno::CONNRESET) if !reset => reset = true,
                Err(Errno::AGAIN) | Err(Errno::CONNRESET) | Err(Errno::NOTCONN) => {
                    return Err(ShareError::Gone)
                }
                Err(e) => return Err(ShareError::io("recvmsg", e)),
            }
        };
        let mut fds = Vec::new();
        for message in control.drain() {
            if let RecvAncillaryMessage::ScmRights(rights) = message {
                fds.extend(rights);
            }
        }
        // A packet of no bytes is what a closed peer reads as, or an empty packet: told apart
        // by whether the peer hung up.
        if got.bytes == 0 && fds.is_empty() && hung_up(self.fd.as_fd()) {
            return Err(ShareError::Gone);
        }
        if got.flags.contains(ReturnFlags::TRUNC) || got.bytes > MAX_FRAME {
            return Err(super::error::WireError::Limit {
                what: "packet",
                max: MAX_FRAME,
                got: got.bytes,
            }
            .into());
        }
        bytes.truncate(got.bytes);
        Ok(Some(Packet {
            bytes,
            fds,
            fds_cut: got.flags.contains(ReturnFlags::CTRUNC),
        }))
    }

    /// Receives one packet, waiting until `deadline`.
    ///
    /// # Errors
    /// [`ShareError::Timeout`]; as [`Channel::try_recv`].
    pub fn recv(&self, deadline: Instant) -> Result<Packet, ShareError> {
        loop {
            if let Some(packet) = self.try_recv()? {
                return Ok(packet);
            }
            wait(self.fd.as_fd(), PollFlags::IN, deadline, "receive")?;
        }
    }
}

impl AsFd for Channel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// A listening socket at a path (removed when dropped).
#[derive(Debug)]
pub struct Listener {
    fd: OwnedFd,
    path: PathBuf,
}

impl Listener {
    /// Listens at `path`. A socket left there by a process that is gone is replaced; one that
    /// answers is another exporter's, and refused.
    ///
    /// # Errors
    /// [`ShareError::NameTaken`] when a live exporter listens there; the I/O error.
    pub fn bind(path: &Path) -> Result<Listener, ShareError> {
        let addr = address(path)?;
        if path.exists() {
            match Channel::connect(path, Instant::now() + Duration::from_millis(100)) {
                Ok(_) | Err(ShareError::Timeout(_)) | Err(ShareError::PeerUser { .. }) => {
                    return Err(ShareError::NameTaken(path.display().to_string()));
                }
                Err(_) => {
                    let _ = std::fs::remove_file(path);
                }
            }
        }
        let fd = seqpacket()?;
        bind(&fd, &addr).map_err(|e| ShareError::io("bind", e))?;
        listen(&fd, 64).map_err(|e| ShareError::io("listen", e))?;
        Ok(Listener {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A connection waiting to be taken, if any (`None`: none now).
    ///
    /// # Errors
    /// The I/O error of `accept`.
    pub fn accept(&self) -> Result<Option<Channel>, ShareError> {
        loop {
            match accept_with(&self.fd, SocketFlags::NONBLOCK | SocketFlags::CLOEXEC) {
                Ok(fd) => return Ok(Some(Channel { fd })),
                Err(Errno::AGAIN) => return Ok(None),
                Err(Errno::INTR) | Err(Errno::CONNABORTED) => {}
                Err(e) => return Err(ShareError::io("accept", e)),
            }
        }
    }
}

impl AsFd for Listener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A pair of connected channels (tests, and an exporter's wake-up line).
///
/// # Errors
/// The I/O error of `socketpair`.
pub fn pair() -> Result<(Channel, Channel), ShareError> {
    let (a, b) = rustix::net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| ShareError::io("socketpair", e))?;
    Ok((Channel { fd: a }, Channel { fd: b }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    #[test]
    fn packets_come_whole_with_their_descriptors() {
        let (a, b) = pair().unwrap();
        let file = tempfile_fd();
        a.send(b"hello", &[file.as_fd()], soon()).unwrap();
        let p = b.recv(soon()).unwrap();
        assert_eq!(p.bytes, b"hello");
        assert_eq!(p.fds.len(), 1);
        assert!(!p.fds_cut);
        assert!(b.try_recv().unwrap().is_none(), "nothing more");
        // An empty packet is not a hang-up.
        a.send(b"", &[], soon()).unwrap();
        assert_eq!(b.recv(soon()).unwrap().bytes, b"");
        let peer = a.check_user().unwrap();
        assert_eq!(peer.pid, std::process::id());
        drop(a);
        assert!(matches!(b.recv(soon()), Err(ShareError::Gone)));
    }

    fn tempfile_fd() -> OwnedFd {
        rustix::fs::memfd_create("t", rustix::fs::MemfdFlags::CLOEXEC).unwrap()
    }

    #[test]
    fn a_peer_that_does_not_read_makes_sends_time_out() {
        let (a, _b) = pair().unwrap();
        let started = Instant::now();
        let big = vec![0u8; 60_000];
        let mut outcome = Ok(());
        for _ in 0..1000 {
            outcome = a.send(&big, &[], Instant::now() + Duration::from_millis(50));
            if outcome.is_err() {
                break;
            }
        }
        assert!(
            matches!(outcome, Err(ShareError::Timeout("send"))),
            "{outcome:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        // And a receive with nothing sent waits its deadline only.
        let (c, _d) = pair().unwrap();
        let started = Instant::now();
        assert!(matches!(
            c.recv(Instant::now() + Duration::from_millis(30)),
            Err(ShareError::Timeout("receive"))
        ));
        assert!(started.elapsed() >= Duration::from_millis(30));
    }

    #[test]
    fn a_listener_replaces_a_dead_socket_and_refuses_a_live_one() {
        let dir = std::env::temp_dir().join(format!("rrmm-transport-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("x.sock");
        assert!(matches!(
            Channel::connect(&path, soon()),
            Err(ShareError::Gone)
        ));
        let listener = Listener::bind(&path).unwrap();
        assert!(matches!(
            Listener::bind(&path),
            Err(ShareError::NameTaken(_))
        ));
        // That probe connected, and closed.
        let probe = listener.accept().unwrap().unwrap();
        assert!(matches!(probe.recv(soon()), Err(ShareError::Gone)));
        let client = Channel::connect(&path, soon()).unwrap();
        let server = listener.accept().unwrap().unwrap();
        assert_eq!(server.check_user().unwrap().pid, std::process::id());
        client.send(b"x", &[], soon()).unwrap();
        assert_eq!(server.recv(soon()).unwrap().bytes, b"x");
        // A socket file nobody listens on (its process died): replaced.
        let stale = dir.join("stale.sock");
        {
            let fd = seqpacket().unwrap();
            bind(&fd, &address(&stale).unwrap()).unwrap();
        }
        assert!(stale.exists());
        let _fresh = Listener::bind(&stale).unwrap();
        drop(listener);
        assert!(!path.exists(), "removed with its listener");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
