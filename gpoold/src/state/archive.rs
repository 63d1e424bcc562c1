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

use crate::error::Error;
use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::os::unix::fs::FileExt;
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

impl Segment {
    /// Writes `records` (in key order, each key once, none longer than
    /// `MAX_KEY`) to `path`, whole or not at all: to a file beside it,
    /// synced, renamed, and the directory synced. A block at a time is in
    /// memory. None where there were no records.
    fn write(
        path: PathBuf,
        seq: u64,
        records: impl Iterator<Item = Result<Record, Error>>,
    ) -> Result<Option<Segment>, Error> {
        let partial = path.with_extension("partial");
        let written = Segment::write_to(&partial, path, seq, records);
        if !matches!(written, Ok(Some(_))) {
            let _ = std::fs::remove_file(&partial);
        }
        written
    }

    fn write_to(
        partial: &Path,
        path: PathBuf,
        seq: u64,
        records: impl Iterator<Item = Result<Record, Error>>,
    ) -> Result<Option<Segment>, Error> {
        let failed = |err| io_failed(partial, err);
        let file = std::fs::File::create(partial).map_err(failed)?;
        let mut out = std::io::BufWriter::with_capacity(1 << 16, file);
        out.write_all(HEAD).map_err(failed)?;
        let mut written = HEAD.len() as u64;
        let mut blocks = Vec::new();
        let mut block = Vec::new();
        let mut first_key = Vec::new();
        let mut in_block = 0;
        let mut n_records = 0u64;
        let mut at = (i64::MAX, i64::MIN);
        let mut last_key = Vec::new();
        let mut end_block = |block: &mut Vec<u8>, first_key: &[u8], out: &mut std::io::BufWriter<std::fs::File>| {
            out.write_all(block)?;
            blocks.push(Block {
                first_key: first_key.into(),
                offset: written,
                len: block.len() as u32,
                hash: hash8(block),
            });
            written += block.len() as u64;
            block.clear();
            Ok::<_, std::io::Error>(())
        };
        for record in records {
            let record = record?;
            if record.key.len() > MAX_KEY || record.key <= last_key && n_records > 0 {
                return Err(damaged(
                    partial,
                    "records to seal were out of key order, or a key was too long",
                ));
            }
            if in_block == 0 {
                first_key.clone_from(&record.key);
            }
            put_record(&mut block, &record);
            in_block += 1;
            n_records += 1;
            at = (at.0.min(record.at), at.1.max(record.at));
            if in_block == BLOCK {
                end_block(&mut block, &first_key, &mut out).map_err(failed)?;
                in_block = 0;
            }
            last_key = record.key;
        }
        if n_records == 0 {
            return Ok(None);
        }
        if in_block > 0 {
            end_block(&mut block, &first_key, &mut out).map_err(failed)?;
        }
        let mut index = Vec::new();
        for block in &blocks {
            index.push(block.first_key.len() as u8);
            index.extend_from_slice(&block.first_key);
            index.extend_from_slice(&block.offset.to_le_bytes());
            index.extend_from_slice(&block.len.to_le_bytes());
            index.extend_from_slice(&block.hash);
        }
        let mut padded_key = [0u8; MAX_KEY];
        padded_key[..last_key.len()].copy_from_slice(&last_key);
        let mut footer = Vec::with_capacity(FOOTER_LEN);
        footer.extend_from_slice(&written.to_le_bytes());
        footer.extend_from_slice(&(index.len() as u32).to_le_bytes());
        footer.extend_from_slice(&(blocks.len() as u32).to_le_bytes());
        footer.extend_from_slice(&n_records.to_le_bytes());
        footer.extend_from_slice(&at.0.to_le_bytes());
        footer.extend_from_slice(&at.1.to_le_bytes());
        footer.push(last_key.len() as u8);
        footer.extend_from_slice(&padded_key);
        footer.extend_from_slice(&hash8(&[&index[..], &footer[..]].concat()));
        footer.extend_from_slice(TAIL);
        out.write_all(&index).map_err(failed)?;
        out.write_all(&footer).map_err(failed)?;
        let file = out.into_inner().map_err(|err| failed(err.into_error()))?;
        file.sync_all().map_err(failed)?;
        std::fs::rename(partial, &path).map_err(|err| io_failed(&path, err))?;
        sync_parent(&path)?;
        Ok(Some(Segment {
            path,
            seq,
            blocks: blocks.into_boxed_slice(),
            last_key: last_key.into_boxed_slice(),
            n_records,
            at,
            removed: AtomicBool::new(false),
        }))
    }

    /// Reads a sealed file's footer and index.
    fn open(path: PathBuf, seq: u64) -> Result<Segment, Error> {
        let file = std::fs::File::open(&path).map_err(|err| io_failed(&path, err))?;
        let size = file.metadata().map_err(|err| io_failed(&path, err))?.len();
        if size < (HEAD.len() + FOOTER_LEN) as u64 {
            return Err(damaged(&path, format!("{size} bytes, too short to be a history file")));
        }
        let mut head = [0u8; HEAD.len()];
        file.read_exact_at(&mut head, 0).map_err(|err| io_failed(&path, err))?;
        if &head != HEAD {
            return Err(damaged(&path, "no start mark: not a history file"));
        }
        let mut footer = [0u8; FOOTER_LEN];
        file.read_exact_at(&mut footer, size - FOOTER_LEN as u64)
            .map_err(|err| io_failed(&path, err))?;
        if footer[FOOTER_LEN - TAIL.len()..] != TAIL[..] {
            return Err(damaged(&path, "no end mark: not a whole history file"));
        }
        let parsed = (|| {
            let mut bytes = Reader(&footer);
            let index_offset = bytes.u64()?;
            let index_len = bytes.u32()?;
            let n_blocks = bytes.u32()?;
            let n_records = bytes.u64()?;
            let at = (bytes.i64()?, bytes.i64()?);
            let key_len = bytes.u8()? as usize;
            if key_len > MAX_KEY {
                return Err(format!("a last key of {key_len} bytes, more than {MAX_KEY}"));
            }
            let last_key = bytes.take(MAX_KEY)?[..key_len].to_vec();
            let hash: [u8; 8] = bytes.array()?;
            let ends = index_offset
                .checked_add(u64::from(index_len))
                .and_then(|end| end.checked_add(FOOTER_LEN as u64));
            if index_offset < HEAD.len() as u64 || ends != Some(size) {
                return Err(format!(
                    "its index ({index_len} bytes at {index_offset}) does not end at its footer"
                ));
            }
            if n_blocks == 0 || n_records < u64::from(n_blocks) {
                return Err(format!("{n_records} records in {n_blocks} blocks"));
            }
            Ok((index_offset, index_len, n_blocks, n_records, at, last_key, hash))
        })();
        let (index_offset, index_len, n_blocks, n_records, at, last_key, hash) =
            parsed.map_err(|reason| damaged(&path, reason))?;
        let mut index = vec![0u8; index_len as usize];
        file.read_exact_at(&mut index, index_offset)
            .map_err(|err| io_failed(&path, err))?;
        if hash8(&[&index[..], &footer[..FOOTER_LEN - 16]].concat()) != hash {
            return Err(damaged(&path, "its index and footer do not match their hash"));
        }
        let mut bytes = Reader(&index);
        let blocks = (0..n_blocks)
            .map(|_| {
                Ok(Block {
                    first_key: bytes.key()?.into(),
                    offset: bytes.u64()?,
                    len: bytes.u32()?,
                    hash: bytes.array()?,
                })
            })
            .collect::<Result<Box<[Block]>, String>>()
            .map_err(|reason| damaged(&path, format!("its index {reason}")))?;
        if !bytes.0.is_empty() {
            return Err(damaged(
                &path,
                format!("{} bytes past its index's last block", bytes.0.len()),
            ));
        }
        let mut next_offset = HEAD.len() as u64;
        for (n, block) in blocks.iter().enumerate() {
            let in_order = n == 0 || blocks[n - 1].first_key < block.first_key;
            if block.offset != next_offset || !in_order {
                return Err(damaged(&path, format!("its index's block {n} is out of place")));
            }
            next_offset += u64::from(block.len);
        }
        if next_offset != index_offset || *last_key < *blocks[blocks.len() - 1].first_key {
            return Err(damaged(&path, "its blocks do not end where its index begins"));
        }
        Ok(Segment {
            path,
            seq,
            blocks,
            last_key: last_key.into_boxed_slice(),
            n_records,
            at,
            removed: AtomicBool::new(false),
        })
    }

    /// Its first and last keys.
    pub fn key_range(&self) -> (&[u8], &[u8]) {
        (&self.blocks[0].first_key, &self.last_key)
    }

    pub fn name(&self) -> String {
        self.path.display().to_string()
    }

    /// Block `n`'s records; a file removed since it was looked up (past
    /// retention) has none.
    fn read_block(&self, n: usize) -> Result<Vec<Record>, Error> {
        let block = &self.blocks[n];
        let file = match std::fs::File::open(&self.path) {
            Ok(file) => file,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound && self.removed.load(Ordering::Acquire) => {
                return Ok(Vec::new())
            }
            Err(err) => return Err(io_failed(&self.path, err)),
        };
        let mut bytes = vec![0u8; block.len as usize];
        file.read_exact_at(&mut bytes, block.offset)
            .map_err(|err| io_failed(&self.path, err))?;
        if hash8(&bytes) != block.hash {
            return Err(damaged(
                &self.path,
                format!("the block at byte {} does not match its hash", block.offset),
            ));
        }
        let mut reader = Reader(&bytes);
        let mut records = Vec::with_capacity(BLOCK);
        while !reader.0.is_empty() {
            records.push(
                read_record(&mut reader)
                    .map_err(|reason| damaged(&self.path, format!("the block at byte {}: {reason}", block.offset)))?,
            );
        }
        Ok(records)
    }

    /// The record with `key`, if the file holds one.
    pub fn get(&self, key: &[u8]) -> Result<Option<Record>, Error> {
        let n = self.blocks.partition_point(|block| *block.first_key <= *key);
        if n == 0 || key > &*self.last_key {
            return Ok(None);
        }
        Ok(self.read_block(n - 1)?.into_iter().find(|record| record.key == key))
    }

    /// The record with the greatest key below `key`, if any.
    fn last_below(&self, key: &[u8]) -> Result<Option<Record>, Error> {
        let n = self.blocks.partition_point(|block| *block.first_key < *key);
        if n == 0 {
            return Ok(None);
        }
        Ok(self
            .read_block(n - 1)?
            .into_iter()
            .take_while(|record| *record.key < *key)
            .last())
    }

    /// Its records, in key order, from `key` on.
    pub fn records_from(self: &Arc<Segment>, key: &[u8]) -> Cursor {
        let first = self.blocks.partition_point(|block| *block.first_key <= *key);
        Cursor {
            segment: self.clone(),
            next_block: first.saturating_sub(1),
            from: key.to_vec(),
            buffered: VecDeque::new(),
        }
    }
}

/// A file's records in key order, a block at a time.
pub struct Cursor {
    segment: Arc<Segment>,
    next_block: usize,
    from: Vec<u8>,
    buffered: VecDeque<Record>,
}

impl Iterator for Cursor {
    type Item = Result<Record, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        while self.buffered.is_empty() {
            if self.next_block >= self.segment.blocks.len() {
                return None;
            }
            match self.segment.read_block(self.next_block) {
                Ok(records) => self.buffered = records.into(),
                Err(err) => {
                    self.next_block = self.segment.blocks.len();
                    return Some(Err(err));
                }
            }
            self.next_block += 1;
            let from = &self.from;
            self.buffered.retain(|record| record.key >= *from);
        }
        self.buffered.pop_front().map(Ok)
    }
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

/// Records from sled and the files, merged in key order: where several
/// hold a key, sled's record, then the newest file's. A file is opened
/// only once the merge reaches its first key.
pub struct Merged<S: Iterator<Item = Result<Record, Error>>> {
    /// The listing's hold, kept while the merge runs.
    _listing: Listing,
    from: Vec<u8>,
    sled: std::iter::Peekable<S>,
    /// Files not yet reached, latest first key last.
    waiting: Vec<Arc<Segment>>,
    open: Vec<(u64, std::iter::Peekable<Cursor>)>,
}

impl<S: Iterator<Item = Result<Record, Error>>> Merged<S> {
    pub fn new(archive: &Archive, from: &[u8], sled: S) -> Merged<S> {
        let (listing, mut files) = archive.listing();
        files.retain(|file| *file.last_key >= *from && file.n_records > 0);
        files.sort_by(|a, b| b.blocks[0].first_key.cmp(&a.blocks[0].first_key));
        Merged {
            _listing: listing,
            from: from.to_vec(),
            sled: sled.peekable(),
            waiting: files,
            open: Vec::new(),
        }
    }
}

impl<S: Iterator<Item = Result<Record, Error>>> Iterator for Merged<S> {
    type Item = Result<Record, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            // The least key in sled and the open files; an error first.
            let mut least: Option<&[u8]> = match self.sled.peek() {
                Some(Ok(record)) => Some(&record.key),
                Some(Err(_)) => return self.sled.next(),
                None => None,
            };
            let mut failed = None;
            for (n, (_, cursor)) in self.open.iter_mut().enumerate() {
                match cursor.peek() {
                    Some(Ok(record)) if least.is_none_or(|least| *record.key < *least) => least = Some(&record.key),
                    Some(Err(_)) => failed = Some(n),
                    _ => {}
                }
            }
            if let Some(n) = failed {
                return self.open[n].1.next();
            }
            let least = least.map(<[u8]>::to_vec);
            // A file that may hold a key at or below it joins first.
            if let Some(file) = self.waiting.last() {
                if least.as_ref().is_none_or(|least| *file.blocks[0].first_key <= **least) {
                    let file = self.waiting.pop().expect("a waiting file");
                    self.open.push((file.seq, file.records_from(&self.from).peekable()));
                    continue;
                }
            }
            let least = least?;
            let mut found: Option<(u64, Record)> = None;
            if self
                .sled
                .peek()
                .is_some_and(|record| record.as_ref().is_ok_and(|record| record.key == least))
            {
                found = self.sled.next().and_then(Result::ok).map(|record| (u64::MAX, record));
            }
            for (seq, cursor) in &mut self.open {
                if cursor
                    .peek()
                    .is_some_and(|record| record.as_ref().is_ok_and(|record| record.key == least))
                {
                    let record = cursor.next().and_then(Result::ok).expect("the record just peeked");
                    if found.as_ref().is_none_or(|(best, _)| *seq > *best) {
                        found = Some((*seq, record));
                    }
                }
            }
            self.open.retain_mut(|(_, cursor)| cursor.peek().is_some());
            return found.map(|(_, record)| Ok(record));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(key: u64, at: i64) -> Record {
        Record {
            key: key.to_be_bytes().to_vec(),
            at,
            value: format!("job {key} at {at}").into_bytes(),
            extra: key.is_multiple_of(3).then(|| vec![key as u8; (key % 7) as usize]),
        }
    }

    fn keys(records: impl Iterator<Item = Result<Record, Error>>) -> Vec<u64> {
        records
            .map(|record| u64::from_be_bytes(record.unwrap().key.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn a_sealed_file_reads_back_each_record_and_its_neighbours() {
        let dir = tempfile::tempdir().unwrap();
        let archive = Archive::open(dir.path(), "jobs").unwrap();
        let records: Vec<Record> = (0..300).map(|n| record(n * 2 + 10, 1000 + n as i64)).collect();
        let file = archive.seal(records.iter().cloned().map(Ok)).unwrap().unwrap();
        assert_eq!(file.at, (1000, 1299));
        assert_eq!(file.blocks.len(), 5);
        for wanted in &records {
            assert_eq!(archive.get(&wanted.key).unwrap().as_ref(), Some(wanted));
        }
        for missing in [0u64, 11, 609, 611, u64::MAX] {
            assert_eq!(archive.get(&missing.to_be_bytes()).unwrap(), None, "key {missing}");
        }
        let below = |key: u64| {
            archive
                .last_below(&key.to_be_bytes())
                .unwrap()
                .map(|record| u64::from_be_bytes(record.key.try_into().unwrap()))
        };
        assert_eq!(below(10), None);
        assert_eq!(below(11), Some(10));
        assert_eq!(below(138), Some(136), "across a block's start");
        assert_eq!(below(u64::MAX), Some(608));
        // Opened again, as after a restart.
        let again = Archive::open(dir.path(), "jobs").unwrap();
        assert_eq!(again.get(&records[77].key).unwrap().as_ref(), Some(&records[77]));
        assert_eq!(keys(file.records_from(&137u64.to_be_bytes())).len(), 236);
    }

    #[test]
    fn a_merge_follows_key_order_and_prefers_sled_then_the_newest_file() {
        let dir = tempfile::tempdir().unwrap();
        let archive = Archive::open(dir.path(), "attempts").unwrap();
        archive.seal((0..200).map(|n| Ok(record(n, 1)))).unwrap().unwrap();
        // A newer file that holds some keys again, and keys past the first.
        archive.seal((150..250).map(|n| Ok(record(n, 2)))).unwrap().unwrap();
        let sled: Vec<Result<Record, Error>> = (240..260).map(|n| Ok(record(n, 3))).collect();
        let merged: Vec<Record> = Merged::new(&archive, &100u64.to_be_bytes(), sled.into_iter())
            .map(Result::unwrap)
            .collect();
        let got: Vec<(u64, i64)> = merged
            .iter()
            .map(|record| (u64::from_be_bytes(record.key.clone().try_into().unwrap()), record.at))
            .collect();
        let expected: Vec<(u64, i64)> = (100..150)
            .map(|n| (n, 1))
            .chain((150..240).map(|n| (n, 2)))
            .chain((240..260).map(|n| (n, 3)))
            .collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn removing_a_file_waits_for_a_listing_that_reads_it() {
        let dir = tempfile::tempdir().unwrap();
        let archive = Arc::new(Archive::open(dir.path(), "jobs").unwrap());
        archive.seal((0..10).map(|n| Ok(record(n, 1)))).unwrap().unwrap();
        let mut listing = Merged::new(&archive, &[], std::iter::empty());
        assert_eq!(keys(listing.by_ref().take(3)), [0, 1, 2]);
        let remover = {
            let archive = archive.clone();
            std::thread::spawn(move || archive.remove(|_| Ok(true)).unwrap())
        };
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!remover.is_finished(), "the file went while a listing read it");
        assert_eq!(keys(listing.by_ref()), [3, 4, 5, 6, 7, 8, 9]);
        drop(listing);
        assert_eq!(remover.join().unwrap(), 10);
        assert!(archive.files().is_empty());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_damaged_file_is_named_and_a_partial_one_removed() {
        let dir = tempfile::tempdir().unwrap();
        let archive = Archive::open(dir.path(), "jobs").unwrap();
        let file = archive.seal((0..100).map(|n| Ok(record(n, 1)))).unwrap().unwrap();
        let mut bytes = std::fs::read(&file.path).unwrap();
        bytes[HEAD.len() + 3] ^= 0xff;
        std::fs::write(&file.path, &bytes).unwrap();
        let err = archive.get(&5u64.to_be_bytes()).unwrap_err().to_string();
        assert!(
            err.contains("jobs-00000001.seg") && err.contains("block at byte 8"),
            "{err}"
        );
        std::fs::write(dir.path().join("jobs-00000002.partial"), b"half").unwrap();
        bytes.truncate(bytes.len() - 1);
        std::fs::write(&file.path, &bytes).unwrap();
        let err = Archive::open(dir.path(), "jobs").err().unwrap().to_string();
        assert!(
            err.contains("jobs-00000001.seg") && err.contains("no end mark"),
            "{err}"
        );
        assert!(!dir.path().join("jobs-00000002.partial").exists());
        // A changed count in the footer (here: of blocks) is caught by its hash.
        bytes.push(b'D');
        let n_blocks_at = bytes.len() - FOOTER_LEN + 12;
        bytes[n_blocks_at] ^= 0x01;
        std::fs::write(&file.path, &bytes).unwrap();
        let err = Archive::open(dir.path(), "jobs").err().unwrap().to_string();
        assert!(err.contains("do not match their hash"), "{err}");
        // A file gone from under gpoold, not by retention, is an error.
        std::fs::remove_file(&file.path).unwrap();
        let err = archive.get(&5u64.to_be_bytes()).unwrap_err().to_string();
        assert!(
            err.contains("jobs-00000001.seg") && err.contains("No such file"),
            "{err}"
        );
    }
}
