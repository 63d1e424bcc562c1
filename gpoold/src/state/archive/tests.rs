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
