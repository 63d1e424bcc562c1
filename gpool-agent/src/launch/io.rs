//! An attempt's output read back for gpoold (`gpool logs`, and the CLI
//! following a job), and keys typed at an interactive attempt's terminal.

use super::*;

impl Attempts {
    /// Bytes typed at an interactive attempt's terminal: into the FIFO its
    /// supervisor relays to the terminal. Keys may come before its Launch
    /// is done (gpoold counts it running once it sent it): they wait in
    /// the FIFO. Dropped, with a warning, for another attempt than the one
    /// running here, or when the terminal is not reading.
    pub fn type_in(&self, input: pb::TerminalInput) {
        use std::os::unix::fs::OpenOptionsExt;
        let key = (input.job_id, input.epoch);
        if self
            .running_epoch(input.job_id)
            .is_some_and(|epoch| epoch != input.epoch)
        {
            tracing::warn!(
                job = input.job_id,
                epoch = input.epoch,
                "input for an attempt not running here; dropped"
            );
            return;
        }
        let path = input_fifo(&self.spool_dir, input.job_id, input.epoch);
        if let Some(size) = input.resize {
            let (rows, cols) = (
                size.rows.clamp(1, u32::from(u16::MAX)) as u16,
                size.cols.clamp(1, u32::from(u16::MAX)) as u16,
            );
            if let Err(err) = crate::terminal::resize(&path, rows, cols) {
                tracing::warn!(job = input.job_id, "its terminal was not resized: {err}");
            }
        }
        if input.data.is_empty() {
            return;
        }
        let mut terminals = self.terminals.lock().unwrap_or_else(|p| p.into_inner());
        let started_here = self.running_epoch(input.job_id).is_some();
        if !started_here && !terminals.contains_key(&key) {
            match open_input_fifo(&path) {
                Ok(fifo) => {
                    terminals.insert(key, fifo);
                }
                Err(err) => tracing::warn!(job = input.job_id, "input for its terminal dropped: {err}"),
            }
        }
        let written = match terminals.get_mut(&key) {
            Some(fifo) => std::io::Write::write_all(fifo, &input.data),
            // Started before this agent did: its supervisor holds the FIFO.
            None => std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(nix::libc::O_NONBLOCK)
                .open(&path)
                .and_then(|mut fifo| std::io::Write::write_all(&mut fifo, &input.data)),
        };
        if let Err(err) = written {
            tracing::warn!(
                job = input.job_id,
                "input for its terminal dropped: {}: {err}",
                path.display()
            );
        }
    }

    /// Sends the output file of an attempt back over the link as LogData,
    /// following it while the attempt runs if asked.
    pub fn stream_log(self: &Arc<Self>, request: pb::ReadLog, outbound: mpsc::Sender<pb::AgentMessage>) {
        let suffix = if request.stderr { "err" } else { "out" };
        let path = attempt_file(&self.spool_dir, request.job_id, request.attempt, suffix);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        self.log_reads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(request.request_id, stop.clone());
        let attempts = self.clone();
        self.spawn_task(async move {
            let request_id = request.request_id;
            attempts.send_log(request, path, outbound, &stop).await;
            attempts
                .log_reads
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&request_id);
        });
    }

    /// gpoold no longer wants the output of log read `request_id`.
    pub fn stop_log(&self, request_id: u64) {
        if let Some(stop) = self
            .log_reads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&request_id)
        {
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Sends `path` as LogData for `request`, following it while the
    /// attempt may write more if asked, until `stop` or its end.
    async fn send_log(
        &self,
        request: pb::ReadLog,
        path: PathBuf,
        outbound: mpsc::Sender<pb::AgentMessage>,
        stop: &std::sync::atomic::AtomicBool,
    ) {
        use tokio::io::AsyncReadExt;
        let message = |data: Vec<u8>, eof: bool, error: String| log_data(request.request_id, data, eof, error);
        let asked = std::time::Instant::now();
        let Some(mut file) = self.open_log(&request, &path, &outbound, stop, asked).await else {
            return;
        };
        // 16 KiB a read (and as much in tokio's file): a follower costs the
        // node little while it waits, and a long file still comes in few
        // messages.
        let mut buffer = vec![0u8; 16 * 1024];
        let pause = self.follow_pause(&request);
        // After the attempt ends, one more pass picks up its last bytes.
        let mut last_pass = false;
        loop {
            if stop.load(std::sync::atomic::Ordering::Relaxed) {
                tracing::info!(
                    job = request.job_id,
                    "log read {} stopped: its reader is gone",
                    request.request_id
                );
                return;
            }
            let n_read = match file.read(&mut buffer).await {
                Ok(n_read) => n_read,
                Err(err) => {
                    let _ = outbound
                        .send(message(Vec::new(), true, format!("{}: {err}", path.display())))
                        .await;
                    return;
                }
            };
            if n_read > 0 {
                if outbound
                    .send(message(buffer[..n_read].to_vec(), false, String::new()))
                    .await
                    .is_err()
                {
                    return;
                }
                continue;
            }
            let running = self.may_write_more(request.job_id, request.epoch, asked);
            if request.follow && running {
                tokio::time::sleep(pause).await;
            } else if request.follow && !last_pass {
                last_pass = true;
            } else {
                let _ = outbound.send(message(Vec::new(), true, String::new())).await;
                return;
            }
        }
    }

    /// Opens the output file, waiting for it to appear where a follower
    /// came first; `None` once the read is answered (empty, or an error).
    async fn open_log(
        &self,
        request: &pb::ReadLog,
        path: &Path,
        outbound: &mpsc::Sender<pb::AgentMessage>,
        stop: &std::sync::atomic::AtomicBool,
        asked: std::time::Instant,
    ) -> Option<tokio::fs::File> {
        // The supervisor creates the file just after the attempt starts: a
        // follower may come first, even before this agent has the attempt
        // running (its Launch is still being spawned).
        let mut opened = tokio::fs::File::open(path).await;
        while request.follow
            && opened
                .as_ref()
                .is_err_and(|err| err.kind() == std::io::ErrorKind::NotFound)
            && self.may_write_more(request.job_id, request.epoch, asked)
            && !stop.load(std::sync::atomic::Ordering::Relaxed)
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
            opened = tokio::fs::File::open(path).await;
        }
        match opened {
            Ok(file) => Some(file),
            // An attempt that wrote nothing leaves no file (nor does one
            // whose output was pruned): it reads as empty.
            Err(err)
                if err.kind() == std::io::ErrorKind::NotFound
                    && !self.may_write_more(request.job_id, request.epoch, asked) =>
            {
                let _ = outbound
                    .send(log_data(request.request_id, Vec::new(), true, String::new()))
                    .await;
                None
            }
            Err(err) => {
                let error = format!("{} on {}: {err}", path.display(), self.node);
                let _ = outbound
                    .send(log_data(request.request_id, Vec::new(), true, error))
                    .await;
                None
            }
        }
    }

    /// How long a follower waits for more output: less while someone is
    /// typing at an interactive attempt.
    fn follow_pause(&self, request: &pb::ReadLog) -> Duration {
        // Someone is typing at an interactive attempt: its echo comes soon.
        if request.epoch != 0 && input_fifo(&self.spool_dir, request.job_id, request.epoch).exists() {
            Duration::from_millis(20)
        } else {
            Duration::from_millis(200)
        }
    }
}

/// One LogData message of log read `request_id`.
fn log_data(request_id: u64, data: Vec<u8>, eof: bool, error: String) -> pb::AgentMessage {
    pb::AgentMessage {
        msg: Some(pb::agent_message::Msg::LogData(pb::LogData {
            request_id,
            data,
            eof,
            error,
        })),
    }
}

/// `<spool>/jobs/<job>.e<epoch>.in`: the FIFO the supervisor of an
/// interactive attempt reads what is typed at its terminal from.
pub fn input_fifo(spool_dir: &Path, job_id: u64, epoch: u64) -> PathBuf {
    spool_dir.join("jobs").join(format!("{job_id}.e{epoch}.in"))
}

/// Makes an interactive attempt's input FIFO (0600) and opens it to read
/// and write without blocking: written to before anything reads it, it
/// keeps what was written.
pub fn open_input_fifo(path: &Path) -> Result<std::fs::File, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    nix::unistd::mkfifo(path, nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR)
        .map_err(|err| format!("{}: {err}", path.display()))?;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(path)
        .map_err(|err| format!("{}: {err}", path.display()))
}
