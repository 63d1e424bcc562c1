//! Listings across sled and the sealed files: their records merged in key
//! order, each key once.

use super::{Archive, Cursor, Listing, Record, Segment};
use crate::error::Error;
use std::sync::Arc;

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
