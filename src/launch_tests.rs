use std::time::{Duration, SystemTime};

use rand::Rng;

use super::*;

#[test]
fn every_waiting_rank_gets_the_published_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nccl-id");
    let id: [u8; 128] = std::array::from_fn(|_| rand::rng().random());
    let deadline = SystemTime::now() + Duration::from_secs(30);
    let got = std::thread::scope(|s| {
        let readers: Vec<_> = (0..3)
            .map(|_| s.spawn(|| wait_for(&path, 128, deadline)))
            .collect();
        std::thread::sleep(Duration::from_millis(50));
        publish(&path, &id).unwrap();
        readers
            .into_iter()
            .map(|r| r.join().unwrap().unwrap())
            .collect::<Vec<_>>()
    });
    for bytes in got {
        assert_eq!(bytes, id);
    }
    // Nothing but the id is left beside it.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["nccl-id"]);
}

#[test]
fn a_second_id_is_refused_and_the_first_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nccl-id");
    publish(&path, &[1; 128]).unwrap();
    let error = publish(&path, &[2; 128]).unwrap_err();
    assert!(
        format!("{error:#}").contains("publishing rendezvous"),
        "{error:#}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), [1; 128]);
}

#[test]
fn waiting_ends_at_the_deadline_and_on_a_wrong_length() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nccl-id");
    let started = std::time::Instant::now();
    let error = wait_for(&path, 128, SystemTime::now() + Duration::from_millis(100)).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("published nothing before the launcher's deadline"),
        "{error}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    std::fs::write(&path, [0u8; 7]).unwrap();
    let error = wait_for(&path, 128, SystemTime::now()).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("7 bytes where 128 were expected"),
        "{error}"
    );
}

#[test]
fn a_rank_shares_the_id_through_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let rank = |rank| Rank {
        rank,
        world_size: 2,
        local_rank: rank,
        rendezvous: dir.path().join("id"),
        deadline: SystemTime::now() + Duration::from_secs(30),
    };
    let (zero, one) = (rank(0), rank(1));
    let made = std::thread::scope(|s| {
        let waiting = s.spawn(|| one.share_id::<16>(|| unreachable!("only rank 0 makes it")));
        let made = zero.share_id(|| Ok([7u8; 16])).unwrap();
        assert_eq!(waiting.join().unwrap().unwrap(), made);
        made
    });
    assert_eq!(made, [7u8; 16]);
}
