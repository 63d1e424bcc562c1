//! A sealed file itself: writing one whole or not at all, opening its footer
//! and index, and reading its blocks (`Cursor`: its records in key order).

use super::{
    damaged, hash8, io_failed, put_record, read_record, sync_parent, Block, Reader, Record, Segment, BLOCK, FOOTER_LEN,
    HEAD, MAX_KEY, TAIL,
};
use crate::error::Error;
use std::collections::VecDeque;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

impl Segment {
    /// Writes `records` (in key order, each key once, none longer than
    /// `MAX_KEY`) to `path`, whole or not at all: to a file beside it,
    /// synced, renamed, and the directory synced. A block at a time is in
    /// memory. None where there were no records.
    pub(super) fn write(
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
        let (index, footer) = index_and_footer(&blocks, written, n_records, at, &last_key);
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
    pub(super) fn open(path: PathBuf, seq: u64) -> Result<Segment, Error> {
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
        let parsed = parse_footer(&footer, size);
        let (index_offset, index_len, n_blocks, n_records, at, last_key, hash) =
            parsed.map_err(|reason| damaged(&path, reason))?;
        let mut index = vec![0u8; index_len as usize];
        file.read_exact_at(&mut index, index_offset)
            .map_err(|err| io_failed(&path, err))?;
        if hash8(&[&index[..], &footer[..FOOTER_LEN - 16]].concat()) != hash {
            return Err(damaged(&path, "its index and footer do not match their hash"));
        }
        let blocks = read_index(&path, &index, n_blocks, index_offset, &last_key)?;
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
    pub(super) fn last_below(&self, key: &[u8]) -> Result<Option<Record>, Error> {
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

/// The index and footer of a sealed file of `blocks`, the index at `written`.
fn index_and_footer(
    blocks: &[Block],
    written: u64,
    n_records: u64,
    at: (i64, i64),
    last_key: &[u8],
) -> (Vec<u8>, Vec<u8>) {
    let mut index = Vec::new();
    for block in blocks {
        index.push(block.first_key.len() as u8);
        index.extend_from_slice(&block.first_key);
        index.extend_from_slice(&block.offset.to_le_bytes());
        index.extend_from_slice(&block.len.to_le_bytes());
        index.extend_from_slice(&block.hash);
    }
    let mut padded_key = [0u8; MAX_KEY];
    padded_key[..last_key.len()].copy_from_slice(last_key);
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
    (index, footer)
}

/// What a sealed file's footer says: its index's offset and length, its
/// numbers of blocks and records, their time span, its last key, and the
/// hash of its index and footer.
type Footer = (u64, u32, u32, u64, (i64, i64), Vec<u8>, [u8; 8]);

/// Parses and checks a footer of a file of `size` bytes.
fn parse_footer(footer: &[u8; FOOTER_LEN], size: u64) -> Result<Footer, String> {
    let mut bytes = Reader(footer);
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
}

/// Reads and checks a sealed file's index of `n_blocks` blocks: the blocks,
/// each after the one before, ending where the index begins.
fn read_index(
    path: &Path,
    index: &[u8],
    n_blocks: u32,
    index_offset: u64,
    last_key: &[u8],
) -> Result<Box<[Block]>, Error> {
    let mut bytes = Reader(index);
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
        .map_err(|reason| damaged(path, format!("its index {reason}")))?;
    if !bytes.0.is_empty() {
        return Err(damaged(
            path,
            format!("{} bytes past its index's last block", bytes.0.len()),
        ));
    }
    let mut next_offset = HEAD.len() as u64;
    for (n, block) in blocks.iter().enumerate() {
        let in_order = n == 0 || blocks[n - 1].first_key < block.first_key;
        if block.offset != next_offset || !in_order {
            return Err(damaged(path, format!("its index's block {n} is out of place")));
        }
        next_offset += u64::from(block.len);
    }
    if next_offset != index_offset || *last_key < *blocks[blocks.len() - 1].first_key {
        return Err(damaged(path, "its blocks do not end where its index begins"));
    }
    Ok(blocks)
}
