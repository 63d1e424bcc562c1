//! An interactive attempt's terminal (`gpool alloc`, `gpool run --pty`):
//! a pseudo-terminal whose slave side is the job's stdin, stdout and
//! stderr and its controlling terminal (the job leads a session of its
//! own, as a login shell does). The supervisor holds the master side and
//! relays it: what the job writes goes to the attempt's stdout file in the
//! spool (which `gpool logs -f` and the CLI follow), and what the user
//! types comes from a FIFO the agent writes (`launch::input_fifo`).

use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::process::Stdio;

/// What the supervisor needs to give an attempt a terminal.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Pty {
    pub rows: u16,
    pub cols: u16,
    /// The FIFO the agent writes typed input to; the supervisor makes it.
    pub input: PathBuf,
}

/// The session an interactive job leads (its pid), or 0: the supervisor
/// passes the signals it outlives on to it, since the job is not in the
/// supervisor's process group.
pub static JOB_SESSION: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// The open terminal of an attempt that has not started yet.
pub struct Terminal {
    master: OwnedFd,
    slave: OwnedFd,
    input: PathBuf,
    /// The input FIFO, open to read (and write, so that it never reads as
    /// ended between two writers).
    fifo: std::fs::File,
}

impl Terminal {
    /// Opens a terminal of `pty`'s size, given to `owner` (uid, gid) where
    /// the job runs as another user, and the input FIFO the agent made
    /// (0600: only the agent writes it), making it if it is missing.
    pub fn open(pty: &Pty, owner: Option<(u32, u32)>) -> Result<Terminal, String> {
        let size = nix::pty::Winsize {
            ws_row: pty.rows,
            ws_col: pty.cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let pair = nix::pty::openpty(Some(&size), None).map_err(|err| format!("cannot open a terminal: {err}"))?;
        // Where the agent finds the terminal to resize it.
        if let Ok(name) = nix::unistd::ttyname(&pair.slave) {
            let _ = std::fs::write(tty_file(&pty.input), name.as_os_str().as_encoded_bytes());
        }
        if let Some((uid, gid)) = owner {
            nix::unistd::fchown(
                std::os::fd::AsRawFd::as_raw_fd(&pair.slave),
                Some(nix::unistd::Uid::from_raw(uid)),
                Some(nix::unistd::Gid::from_raw(gid)),
            )
            .map_err(|err| format!("cannot give the terminal to uid {uid}: {err}"))?;
        }
        use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
        let fifo = if std::fs::metadata(&pty.input).is_ok_and(|meta| meta.file_type().is_fifo()) {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(nix::libc::O_NONBLOCK)
                .open(&pty.input)
                .map_err(|err| format!("{}: {err}", pty.input.display()))?
        } else {
            crate::launch::open_input_fifo(&pty.input)?
        };
        Ok(Terminal {
            master: pair.master,
            slave: pair.slave,
            input: pty.input.clone(),
            fifo,
        })
    }

    /// The slave side, for one of the job's standard streams.
    pub fn stdio(&self) -> Result<Stdio, String> {
        self.slave
            .try_clone()
            .map(Stdio::from)
            .map_err(|err| format!("cannot open the terminal: {err}"))
    }

    /// Relays the terminal until nothing holds its slave side any more
    /// (the job and all it started are gone): its output to `out`, the
    /// input FIFO to it. Call once the job is spawned and every copy of the
    /// slave side but the job's is closed. The receiver hears when the
    /// last output is written.
    pub fn relay(self, mut out: Option<std::fs::File>) -> std::sync::mpsc::Receiver<()> {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let Terminal {
            master,
            slave,
            input,
            fifo,
        } = self;
        drop(slave);
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut master = std::fs::File::from(master);
            let mut buffer = vec![0u8; 16 * 1024];
            loop {
                let (output, typed) = {
                    let mut fds = [
                        PollFd::new(master.as_fd(), PollFlags::POLLIN),
                        PollFd::new(fifo.as_fd(), PollFlags::POLLIN),
                    ];
                    match poll(&mut fds, PollTimeout::NONE) {
                        Ok(_) => {}
                        Err(nix::errno::Errno::EINTR) => continue,
                        Err(_) => break,
                    }
                    let ready = |fd: &PollFd| fd.revents().is_some_and(|events| !events.is_empty());
                    (ready(&fds[0]), ready(&fds[1]))
                };
                if output {
                    match master.read(&mut buffer) {
                        // EIO: every holder of the slave side is gone.
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if let Some(file) = out.as_mut() {
                                let _ = file.write_all(&buffer[..n]);
                            }
                        }
                    }
                }
                if typed {
                    if let Ok(n) = (&fifo).read(&mut buffer) {
                        let _ = master.write_all(&buffer[..n]);
                    }
                }
            }
            let _ = std::fs::remove_file(&input);
            let _ = std::fs::remove_file(tty_file(&input));
            let _ = done.send(());
        });
        finished
    }
}

/// What a forked child does before it runs an interactive job: leads a
/// session of its own, whose controlling terminal is its stdin. Runs
/// between fork and exec, so it only makes async-signal-safe calls.
pub fn take_terminal() -> std::io::Result<()> {
    nix::unistd::setsid()?;
    // SAFETY: TIOCSCTTY on the child's own stdin (the terminal's slave
    // side), with 0: do not steal it from another session.
    if unsafe { nix::libc::ioctl(0, nix::libc::TIOCSCTTY, 0) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Beside an attempt's input FIFO: the path of its terminal (`/dev/pts/N`),
/// while it is open.
pub fn tty_file(input: &std::path::Path) -> PathBuf {
    input.with_extension("tty")
}

/// Gives the terminal of the attempt whose input FIFO is `input` a new
/// size: the kernel tells its foreground process (SIGWINCH), as a resized
/// terminal window does.
pub fn resize(input: &std::path::Path, rows: u16, cols: u16) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let file = tty_file(input);
    let name = std::fs::read_to_string(&file).map_err(|err| format!("{}: {err}", file.display()))?;
    let tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(nix::libc::O_NOCTTY | nix::libc::O_NONBLOCK)
        .open(name.trim())
        .map_err(|err| format!("{}: {err}", name.trim()))?;
    let size = nix::libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize from `size`, on an open terminal.
    if unsafe { nix::libc::ioctl(tty.as_raw_fd(), nix::libc::TIOCSWINSZ, &size) } < 0 {
        return Err(format!("{}: {}", name.trim(), std::io::Error::last_os_error()));
    }
    Ok(())
}
