//! `gpool alloc` and `gpool run --pty`: this terminal relayed to an
//! interactive job's on its node (through gpoold and the node's agent)
//! until the job ends. What is typed goes as it comes (WriteInput), in raw
//! mode, so Ctrl-C, Ctrl-D and the arrow keys reach the job; what the job
//! writes comes back as its followed output (JobLogs).

use crate::CliError;
use gpool_core::model::TerminalSize;
use gpool_proto::pb;
use std::io::Read;

/// `gpool alloc`: the submit flags, on a terminal; without a command,
/// the node's account shell (the agent sets SHELL), interactive, in a job
/// named `interactive` unless -J names it.
pub async fn alloc(ctx: &super::Ctx, mut args: super::submit::SubmitArgs) -> Result<u8, CliError> {
    args.pty = true;
    if args.command.is_empty() && args.wrap.is_none() {
        args.command = ["/bin/sh", "-c", "exec \"${SHELL:-/bin/sh}\" -i"]
            .map(String::from)
            .to_vec();
        args.name.get_or_insert_with(|| "interactive".into());
    }
    super::submit::run(ctx, args).await
}

/// How often a session tells gpoold it is attached: well within the
/// shortest `detach_grace` (5 s).
const KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(1);

/// `gpool attach ID`: this terminal relayed to a running interactive
/// job's, until it ends.
pub async fn attach(ctx: &super::Ctx, id: super::JobRef) -> Result<u8, CliError> {
    let job = super::jobs::fetch(ctx, id).await?;
    if job.spec.as_ref().is_none_or(|spec| spec.pty.is_none()) {
        return Err(CliError::Usage(format!(
            "job {}: it has no terminal to attach to (only jobs of gpool alloc and gpool run --pty have one)",
            job.id
        )));
    }
    let mut conn = ctx.connect().await?;
    session(&mut conn, job.id).await
}

/// `gpool run`: the submit flags, followed (`--attach`) or on a terminal
/// (`--pty`).
pub async fn run(ctx: &super::Ctx, mut args: super::submit::SubmitArgs) -> Result<u8, CliError> {
    args.attach |= !args.pty;
    super::submit::run(ctx, args).await
}

/// The size of this process's terminal (24×80 off a terminal).
pub fn size() -> TerminalSize {
    let mut size = nix::libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    for fd in [0, 1, 2] {
        // SAFETY: TIOCGWINSZ writes one winsize into `size`.
        if unsafe { nix::libc::ioctl(fd, nix::libc::TIOCGWINSZ, &mut size) } == 0 && size.ws_row > 0 {
            return TerminalSize {
                rows: size.ws_row,
                cols: size.ws_col.max(1),
            };
        }
    }
    TerminalSize { rows: 24, cols: 80 }
}

/// This terminal in raw mode while it lives (none off a terminal): keys go
/// to the job as typed, and its terminal echoes them.
struct Raw(Option<nix::sys::termios::Termios>);

impl Raw {
    fn enter() -> Raw {
        use nix::sys::termios::{cfmakeraw, tcgetattr, tcsetattr, SetArg};
        let stdin = std::io::stdin();
        let Ok(saved) = tcgetattr(&stdin) else {
            return Raw(None);
        };
        let mut raw = saved.clone();
        cfmakeraw(&mut raw);
        match tcsetattr(&stdin, SetArg::TCSADRAIN, &raw) {
            Ok(()) => Raw(Some(saved)),
            Err(_) => Raw(None),
        }
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            let _ = nix::sys::termios::tcsetattr(std::io::stdin(), nix::sys::termios::SetArg::TCSADRAIN, saved);
        }
    }
}

/// Says gpoold this session is attached to job `id`, every `KEEPALIVE`,
/// until aborted: a session nobody holds is hung up on after its grace.
async fn keep_attached(mut client: crate::client::Client, id: u64) {
    loop {
        let request = pb::WriteInputRequest {
            id,
            data: Vec::new(),
            resize: None,
        };
        let _ = client.write_input(request).await;
        tokio::time::sleep(KEEPALIVE).await;
    }
}

/// Sends typed input; false once gpoold refuses it. A node with a full
/// input lane pushes back: the input waits here (and the reader thread
/// behind it) until it takes more.
async fn type_in(client: &mut crate::client::Client, request: pb::WriteInputRequest) -> bool {
    let mut pause = std::time::Duration::from_millis(10);
    loop {
        match client.write_input(request.clone()).await {
            Ok(_) => return true,
            Err(status) if status.code() == tonic::Code::ResourceExhausted => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_millis(500));
            }
            Err(_) => return false,
        }
    }
}

/// Relays this terminal to job `id`'s from when it starts until it ends,
/// and returns its exit code (as srun and salloc do).
pub async fn session(conn: &mut super::Connection, id: u64) -> Result<u8, CliError> {
    super::logs::wait_until_started(conn, id).await?;
    eprintln!("gpool: job {id} has started; this terminal is its until it ends");
    let raw = Raw::enter();
    let on_terminal = raw.0.is_some();
    let (typed, mut keys) = tokio::sync::mpsc::channel::<Vec<u8>>(64);
    // A blocking read of stdin on a thread of its own: it ends with the
    // process.
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin();
        let mut buffer = [0u8; 4096];
        loop {
            match stdin.read(&mut buffer) {
                Ok(0) | Err(_) => {
                    // Piped input's end is typed as Ctrl-D.
                    if !on_terminal {
                        let _ = typed.blocking_send(vec![4]);
                    }
                    return;
                }
                Ok(n) => {
                    if typed.blocking_send(buffer[..n].to_vec()).is_err() {
                        return;
                    }
                }
            }
        }
    });
    let keepalive = tokio::spawn(keep_attached(conn.client.clone(), id));
    let mut client = conn.client.clone();
    let typing = tokio::spawn(async move {
        // A resized window resizes the job's terminal too (SIGWINCH).
        let mut resized = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change()).ok();
        loop {
            let (data, resize) = tokio::select! {
                key = keys.recv() => match key {
                    Some(data) => (data, None),
                    None => return,
                },
                Some(()) = async { resized.as_mut()?.recv().await } => {
                    let size = size();
                    (Vec::new(), Some(pb::TerminalSize { rows: size.rows.into(), cols: size.cols.into() }))
                }
            };
            if !type_in(&mut client, pb::WriteInputRequest { id, data, resize }).await {
                return;
            }
        }
    });
    let streamed = super::logs::stream(conn, id, (true, false), (0, 0), None).await;
    typing.abort();
    keepalive.abort();
    drop(raw);
    streamed?;
    let how = super::jobs::Waiting {
        fail_fast: false,
        own_code: true,
        json: false,
        quiet: true,
    };
    super::jobs::wait_for(conn, &[id], how).await
}
