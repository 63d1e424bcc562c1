//! The redo log of a batch too large for one sled transaction (a file of
//! 100,000 jobs): its records go to a file a part at a time as they are
//! encoded, and are applied to sled, a part per transaction, once the file
//! is whole and on disk (`store::Commit`). So such a batch is whole or
//! absent after a crash, and is never held whole in memory, in sled's
//! or gpoold's.
//!
//! The file is a run of frames: a kind byte (`PART` or `WHOLE`), the
//! payload's length (u32, little-endian), the first 8 bytes of the
//! payload's BLAKE3 hash, and the payload. A part's payload is a part of
//! the batch as `store` encodes it; the last frame, the whole mark, holds
//! the number of parts (u64). Whether a log is to be applied is sled's to
//! say (`store`): a log is applied only once it is synced whole.

use super::archive::{hash8, io_failed, sync_parent};
use crate::error::Error;
use std::io::{BufReader, BufWriter, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

const PART: u8 = b'P';
const WHOLE: u8 = b'W';
/// Kind, length and hash.
const FRAME_HEAD: usize = 13;

/// A redo log being written.
pub struct RedoWriter {
    path: PathBuf,
    out: BufWriter<std::fs::File>,
    n_parts: u64,
}

impl RedoWriter {
    /// Starts the log at `path`, over whatever an earlier failed batch left
    /// there. Readable by gpoold's user alone: it holds environments.
    pub fn create(path: &Path) -> Result<RedoWriter, Error> {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)
            .map_err(|err| io_failed(path, err))?;
        // A log left from before keeps its mode: set it.
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(|err| io_failed(path, err))?;
        Ok(RedoWriter {
            path: path.to_path_buf(),
            out: BufWriter::with_capacity(1 << 16, file),
            n_parts: 0,
        })
    }

    fn frame(&mut self, kind: u8, payload: &[u8]) -> Result<(), Error> {
        let len = u32::try_from(payload.len()).map_err(|_| {
            Error::Storage(format!(
                "{}: a part of {} bytes, over 4 GiB",
                self.path.display(),
                payload.len()
            ))
        })?;
        let mut head = [0u8; FRAME_HEAD];
        head[0] = kind;
        head[1..5].copy_from_slice(&len.to_le_bytes());
        head[5..].copy_from_slice(&hash8(payload));
        self.out
            .write_all(&head)
            .and_then(|()| self.out.write_all(payload))
            .map_err(|err| io_failed(&self.path, err))
    }

    pub fn part(&mut self, payload: &[u8]) -> Result<(), Error> {
        self.frame(PART, payload)?;
        self.n_parts += 1;
        Ok(())
    }

    /// Marks the log whole and makes it durable (the file and its name).
    pub fn finish(mut self) -> Result<(), Error> {
        self.frame(WHOLE, &self.n_parts.to_le_bytes())?;
        let file = self
            .out
            .into_inner()
            .map_err(|err| io_failed(&self.path, err.into_error()))?;
        file.sync_all().map_err(|err| io_failed(&self.path, err))?;
        sync_parent(&self.path)
    }
}

enum Frame {
    Part(Vec<u8>),
    Whole(u64),
    /// Short, unknown or not matching its hash.
    Broken(String),
    End,
}

/// Reads into `buf` until it is full or the input ends; how much it read.
fn read_up_to(input: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match input.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(read) => n += read,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    Ok(n)
}

fn read_frame(input: &mut impl Read) -> std::io::Result<Frame> {
    let mut head = [0u8; FRAME_HEAD];
    match read_up_to(input, &mut head)? {
        0 => return Ok(Frame::End),
        FRAME_HEAD => {}
        n => return Ok(Frame::Broken(format!("a frame cut short after {n} bytes"))),
    }
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
    // Grows only as far as the file goes: a torn length allocates nothing.
    let mut payload = Vec::new();
    input.take(len as u64).read_to_end(&mut payload)?;
    if payload.len() < len {
        return Ok(Frame::Broken(format!(
            "a frame of {len} bytes cut short at {}",
            payload.len()
        )));
    }
    if hash8(&payload) != head[5..] {
        return Ok(Frame::Broken("a frame does not match its hash".into()));
    }
    Ok(match (head[0], <[u8; 8]>::try_from(payload.as_slice())) {
        (PART, _) => Frame::Part(payload),
        (WHOLE, Ok(n_parts)) => Frame::Whole(u64::from_le_bytes(n_parts)),
        (WHOLE, Err(_)) => Frame::Broken(format!("a whole mark of {len} bytes, not 8")),
        (kind, _) => Frame::Broken(format!("a frame of unknown kind {kind}")),
    })
}

fn open_frames(path: &Path) -> Result<Option<BufReader<std::fs::File>>, Error> {
    match std::fs::File::open(path) {
        Ok(file) => Ok(Some(BufReader::with_capacity(1 << 16, file))),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(io_failed(path, err)),
    }
}

/// What `replay` found.
#[derive(Debug, PartialEq, Eq)]
pub enum Replayed {
    NoLog,
    /// A log without its whole mark (cut short, or damaged), of which
    /// nothing was handed to `apply`.
    NotWhole(String),
    /// A whole log, each of its parts handed to `apply` in order. The log
    /// stays until `remove` (once what was applied is durable).
    Applied {
        n_parts: u64,
    },
}

/// Hands each part of the log at `path` to `apply` with its number, in
/// order, once it has read the whole log and found it whole.
pub fn replay(path: &Path, mut apply: impl FnMut(u64, &[u8]) -> Result<(), Error>) -> Result<Replayed, Error> {
    let Some(mut frames) = open_frames(path)? else {
        return Ok(Replayed::NoLog);
    };
    let read_failed = |err| io_failed(path, err);
    let mut n_parts = 0u64;
    let not_whole = loop {
        match read_frame(&mut frames).map_err(read_failed)? {
            Frame::Part(_) => n_parts += 1,
            Frame::Whole(n) if n == n_parts => break None,
            Frame::Whole(n) => break Some(format!("its mark says {n} parts, and {n_parts} precede it")),
            Frame::Broken(reason) => break Some(reason),
            Frame::End => break Some(format!("it ends after {n_parts} parts without its whole mark")),
        }
    };
    if let Some(reason) = not_whole {
        return Ok(Replayed::NotWhole(reason));
    }
    let Some(mut frames) = open_frames(path)? else {
        return Err(damaged(path, "it vanished while it was read"));
    };
    for part_idx in 0..n_parts {
        match read_frame(&mut frames).map_err(read_failed)? {
            Frame::Part(part) => apply(part_idx, &part)?,
            _ => {
                return Err(damaged(
                    path,
                    format!("part {part_idx} of {n_parts} changed while it was read"),
                ))
            }
        }
    }
    Ok(Replayed::Applied { n_parts })
}

/// A damaged or unreadable log, naming it.
pub fn damaged(path: &Path, reason: impl std::fmt::Display) -> Error {
    Error::CorruptRedo {
        file: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// Removes the log, durably; whether there was one.
pub fn remove(path: &Path) -> Result<bool, Error> {
    match std::fs::remove_file(path) {
        Ok(()) => sync_parent(path).map(|()| true),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(err) => Err(io_failed(path, err)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(dir: &Path, parts: &[&[u8]]) -> PathBuf {
        let path = dir.join("redo.log");
        let mut log = RedoWriter::create(&path).expect("create");
        for part in parts {
            log.part(part).expect("part");
        }
        log.finish().expect("finish");
        path
    }

    fn replayed(path: &Path) -> (Replayed, Vec<Vec<u8>>) {
        let mut parts = Vec::new();
        let replayed = replay(path, |part_idx, part| {
            assert_eq!(part_idx as usize, parts.len());
            parts.push(part.to_vec());
            Ok(())
        })
        .expect("replay");
        (replayed, parts)
    }

    #[test]
    fn a_whole_log_gives_back_its_parts_in_order_and_stays_until_removed() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = written(dir.path(), &[b"first", b"", b"third part"]);
        let (replayed, parts) = replayed(&path);
        assert_eq!(replayed, Replayed::Applied { n_parts: 3 });
        assert_eq!(parts, [b"first".to_vec(), Vec::new(), b"third part".to_vec()]);
        assert!(path.exists());
        remove(&path).expect("remove");
        assert_eq!(self::replayed(&path).0, Replayed::NoLog);
    }

    #[test]
    fn a_log_cut_anywhere_before_its_mark_is_not_whole_and_nothing_is_applied() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = written(dir.path(), &[b"first", b"second"]);
        let whole = std::fs::read(&path).expect("read");
        for cut in 0..whole.len() {
            std::fs::write(&path, &whole[..cut]).expect("write");
            let (replayed, parts) = replayed(&path);
            assert!(matches!(replayed, Replayed::NotWhole(_)), "cut at {cut}: {replayed:?}");
            assert!(parts.is_empty(), "cut at {cut}: nothing is applied");
        }
    }

    #[test]
    fn the_log_is_readable_by_its_owner_alone_even_over_an_older_file() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let older = dir.path().join("redo.log");
        std::fs::write(&older, b"left over").expect("write");
        std::fs::set_permissions(&older, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let path = written(dir.path(), &[b"first"]);
        let mode = std::fs::metadata(&path).expect("metadata").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_log_with_a_damaged_part_is_not_whole_and_nothing_is_applied() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = written(dir.path(), &[b"first", b"second"]);
        let mut bytes = std::fs::read(&path).expect("read");
        // A byte of the second part's payload.
        let at = 2 * FRAME_HEAD + b"first".len() + 2;
        bytes[at] ^= 0xff;
        std::fs::write(&path, &bytes).expect("write");
        let (replayed, parts) = replayed(&path);
        assert_eq!(replayed, Replayed::NotWhole("a frame does not match its hash".into()));
        assert!(parts.is_empty());
    }

    #[test]
    fn an_error_applying_a_part_stops_the_replay_and_keeps_the_log() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = written(dir.path(), &[b"first", b"second"]);
        let mut applied = 0;
        let err = replay(&path, |_, _| {
            applied += 1;
            Err(Error::Storage("disk full".into()))
        })
        .expect_err("the error comes back");
        assert_eq!((applied, err.to_string().contains("disk full")), (1, true));
        assert!(path.exists(), "kept for the next start");
    }
}
