//! Sealed history files: old ended jobs and accounting records, moved out
//! of sled so that gpoold's memory does not grow with its history.
//!
//! sled keeps an in-memory stub for every page of every tree, for good, and
//! appends leave its leaves half full: each ended job cost about 90 bytes
//! of memory for as long as it was kept. Once sled holds a file's worth of
//! records of a kind more than it keeps (`store::Sealer`), the oldest go
//! to one file of records sorted by key, which is never changed again;
//! memory keeps only each file's block index (the first key of every
//! `BLOCK` records).
//!
//! A seal, in order: the file is written, synced and renamed into place,
//! and the directory synced; the file is published (readers look in it
//! from then on); listings that began before it are waited out; then each record
//! leaves sled, but only if sled still holds the same bytes (a record
//! written again meanwhile stays, and wins). A crash in between leaves a
//! record in both places: readers take sled's, then the newest file's, and
//! `open` finishes the removal for the newest file.
//!
//! File layout (integers little-endian): the magic `HEAD`; blocks of
//! records, each `key_len: u8, key, at: i64, value_len: u32, value,
//! extra_len: u32 (u32::MAX: none), extra`; the index, for each block
//! `key_len: u8, first key, offset: u64, len: u32, hash: [u8; 8]` (the
//! start of the block's BLAKE3); then the fixed-size footer (`FOOTER_LEN`).

mod merged;
mod segment;

pub use merged::Merged;
pub use segment::Cursor;

use crate::error::Error;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};

const HEAD: &[u8; 8] = b"GPHIST01";
const TAIL: &[u8; 8] = b"GPHISTND";
/// Records per block: what one read brings in to find a record.
const BLOCK: usize = 64;
/// The longest key (a job id is 8 bytes, an accounting record's key 16).
const MAX_KEY: usize = 16;
/// index offset, index length, blocks, records, first and last `at`, last
/// key (its length and 16 bytes), index hash, `TAIL`.
const FOOTER_LEN: usize = 8 + 4 + 4 + 8 + 8 + 8 + 1 + MAX_KEY + 8 + 8;

/// One record of a file: its sled key, a time (when the job or attempt
/// ended), its sled value, and a second value kept with it (a job's
/// environment).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub key: Vec<u8>,
    pub at: i64,
    pub value: Vec<u8>,
    pub extra: Option<Vec<u8>>,
}

struct Block {
    first_key: Box<[u8]>,
    offset: u64,
    len: u32,
    hash: [u8; 8],
}

/// A sealed file, as memory knows it: where each block starts.
pub struct Segment {
    path: PathBuf,
    seq: u64,
    blocks: Box<[Block]>,
    last_key: Box<[u8]>,
    pub n_records: u64,
    /// The earliest and latest `at` of its records.
    pub at: (i64, i64),
    /// Removed past retention: gone from the disk is no error.
    removed: AtomicBool,
}

fn damaged(path: &Path, reason: impl std::fmt::Display) -> Error {
    Error::CorruptHistory {
        file: path.display().to_string(),
        reason: reason.to_string(),
    }
}

pub(super) fn io_failed(path: &Path, err: std::io::Error) -> Error {
    Error::Storage(format!("{}: {err}", path.display()))
}

/// Syncs the directory that holds `path`, so that a file's creation,
/// rename or removal there is on disk.
pub(super) fn sync_parent(path: &Path) -> Result<(), Error> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::File::open(dir)
        .and_then(|dir| dir.sync_all())
        .map_err(|err| io_failed(dir, err))
}

pub(super) fn hash8(bytes: &[u8]) -> [u8; 8] {
    let mut out = [0u8; 8];
    out.copy_from_slice(&blake3::hash(bytes).as_bytes()[..8]);
    out
}

/// Reads little-endian fields off the front of some bytes, saying what is
/// short (history files here, the redo log in `store`).
pub(super) struct Reader<'a>(pub(super) &'a [u8]);

impl<'a> Reader<'a> {
    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err(format!("cut short: {} bytes left, {n} expected", self.0.len()));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }
    pub(super) fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    pub(super) fn u32(&mut self) -> Result<u32, String> {
        self.array().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Result<u64, String> {
        self.array().map(u64::from_le_bytes)
    }
    fn i64(&mut self) -> Result<i64, String> {
        self.array().map(i64::from_le_bytes)
    }
    fn key(&mut self) -> Result<&'a [u8], String> {
        let len = self.u8()? as usize;
        if len > MAX_KEY {
            return Err(format!("a key of {len} bytes, more than {MAX_KEY}"));
        }
        self.take(len)
    }
}

fn put_record(out: &mut Vec<u8>, record: &Record) {
    out.push(record.key.len() as u8);
    out.extend_from_slice(&record.key);
    out.extend_from_slice(&record.at.to_le_bytes());
    out.extend_from_slice(&(record.value.len() as u32).to_le_bytes());
    out.extend_from_slice(&record.value);
    match &record.extra {
        Some(extra) => {
            out.extend_from_slice(&(extra.len() as u32).to_le_bytes());
            out.extend_from_slice(extra);
        }
        None => out.extend_from_slice(&u32::MAX.to_le_bytes()),
    }
}

fn read_record(bytes: &mut Reader<'_>) -> Result<Record, String> {
    let key = bytes.key()?.to_vec();
    let at = bytes.i64()?;
    let len = bytes.u32()? as usize;
    let value = bytes.take(len)?.to_vec();
    let extra = match bytes.u32()? {
        u32::MAX => None,
        len => Some(bytes.take(len as usize)?.to_vec()),
    };
    Ok(Record { key, at, value, extra })
}

/// Listings under way, by the version of the file list they read: a
/// removal from sled waits until none that began before its file was
/// published is left.
#[derive(Default)]
struct Readers {
    open: Mutex<BTreeMap<u64, usize>>,
    left: Condvar,
}

/// A listing's hold on the file list it read; dropped when it ends.
pub struct Listing {
    readers: Arc<Readers>,
    version: u64,
}

impl Drop for Listing {
    fn drop(&mut self) {
        let mut open = self
            .readers
            .open
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(count) = open.get_mut(&self.version) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.version);
            }
        }
        self.readers.left.notify_all();
    }
}

/// The sealed files of one kind of record (`jobs` or `attempts`), oldest
/// first.
pub struct Archive {
    dir: PathBuf,
    kind: &'static str,
    files: RwLock<(u64, Vec<Arc<Segment>>)>,
    readers: Arc<Readers>,
    next_seq: AtomicU64,
}

impl Archive {
    /// The files of `kind` in `dir` (created if missing, readable only by
    /// gpoold); a partial file a crash left is removed.
    pub fn open(dir: &Path, kind: &'static str) -> Result<Archive, Error> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(dir).map_err(|err| io_failed(dir, err))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(|err| io_failed(dir, err))?;
        let mut found = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|err| io_failed(dir, err))? {
            let path = entry.map_err(|err| io_failed(dir, err))?.path();
            let Some(name) = path.file_name().and_then(|name| name.to_str()) else {
                continue;
            };
            let Some(rest) = name.strip_prefix(kind).and_then(|rest| rest.strip_prefix('-')) else {
                continue;
            };
            if rest.ends_with(".partial") {
                tracing::warn!("removing {}, a history file a crash left unfinished", path.display());
                std::fs::remove_file(&path).map_err(|err| io_failed(&path, err))?;
            } else if let Some(seq) = rest.strip_suffix(".seg").and_then(|seq| seq.parse::<u64>().ok()) {
                found.push((path, seq));
            }
        }
        let mut files = found
            .into_iter()
            .map(|(path, seq)| Segment::open(path, seq).map(Arc::new))
            .collect::<Result<Vec<_>, Error>>()?;
        files.sort_by_key(|file| file.seq);
        let next_seq = files.last().map_or(1, |file| file.seq + 1);
        Ok(Archive {
            dir: dir.to_path_buf(),
            kind,
            files: RwLock::new((0, files)),
            readers: Arc::default(),
            next_seq: AtomicU64::new(next_seq),
        })
    }

    /// The files now, oldest first, for a lookup of one key (a file
    /// removed meanwhile reads as empty).
    pub fn files(&self) -> Vec<Arc<Segment>> {
        self.files
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .1
            .clone()
    }

    /// The files now, for a listing: no record leaves sled for a file
    /// published later until the `Listing` is dropped.
    pub fn listing(&self) -> (Listing, Vec<Arc<Segment>>) {
        let files = self.files.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut open = self
            .readers
            .open
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *open.entry(files.0).or_default() += 1;
        let listing = Listing {
            readers: self.readers.clone(),
            version: files.0,
        };
        (listing, files.1.clone())
    }

    /// The newest file's record with `key`, if any.
    pub fn get(&self, key: &[u8]) -> Result<Option<Record>, Error> {
        for file in self.files().iter().rev() {
            if let Some(record) = file.get(key)? {
                return Ok(Some(record));
            }
        }
        Ok(None)
    }

    /// The record with the greatest key below `key` in any file (the
    /// newest file's, where several hold it).
    pub fn last_below(&self, key: &[u8]) -> Result<Option<Record>, Error> {
        let mut best: Option<Record> = None;
        for file in self.files().iter().rev() {
            if let Some(record) = file.last_below(key)? {
                if best.as_ref().is_none_or(|best| record.key > best.key) {
                    best = Some(record);
                }
            }
        }
        Ok(best)
    }

    /// Writes `records` (in key order, each key once) to a new file and
    /// publishes it, then waits until every listing that began before has
    /// ended: from then on, every reader finds the records in the file.
    /// None where there were no records.
    pub fn seal(&self, records: impl Iterator<Item = Result<Record, Error>>) -> Result<Option<Arc<Segment>>, Error> {
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.join(format!("{}-{seq:08}.seg", self.kind));
        let Some(file) = Segment::write(path, seq, records)? else {
            return Ok(None);
        };
        let file = Arc::new(file);
        let version = self.change(|files| files.push(file.clone()));
        self.wait_for_listings_before(version);
        Ok(Some(file))
    }

    /// Removes the files `drop` picks, once no listing reads them; returns
    /// how many records they held.
    pub fn remove(&self, mut drop: impl FnMut(&Arc<Segment>) -> Result<bool, Error>) -> Result<u64, Error> {
        let mut dropped = Vec::new();
        for file in self.files() {
            if drop(&file)? {
                dropped.push(file);
            }
        }
        if dropped.is_empty() {
            return Ok(0);
        }
        let version = self.change(|files| files.retain(|file| !dropped.iter().any(|gone| Arc::ptr_eq(gone, file))));
        self.wait_for_listings_before(version);
        let mut n_records = 0;
        for file in dropped {
            file.removed.store(true, Ordering::Release);
            std::fs::remove_file(&file.path).map_err(|err| io_failed(&file.path, err))?;
            n_records += file.n_records;
        }
        Ok(n_records)
    }

    /// The newest file, if any.
    pub fn newest(&self) -> Option<Arc<Segment>> {
        self.files().last().cloned()
    }

    fn change(&self, change: impl FnOnce(&mut Vec<Arc<Segment>>)) -> u64 {
        let mut files = self.files.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        change(&mut files.1);
        files.0 += 1;
        files.0
    }

    fn wait_for_listings_before(&self, version: u64) {
        let mut open = self
            .readers
            .open
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        while open.range(..version).next().is_some() {
            open = self
                .readers
                .left
                .wait(open)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }
}

#[cfg(test)]
mod tests;
