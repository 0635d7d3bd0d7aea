//! Data-parallel runs on simulated CPU ranks (threads joined by a `collective::World`)
//! against the one-process run of the combined batch.

use std::sync::Arc;

use kiln_frontend::model::random_parameters;
use kiln_runtime::collective::World;
use rand::{Rng, SeedableRng};

use super::*;
use crate::schedule::Decay;

fn options(batch: usize, ranks: usize, accumulate: u64) -> RunOptions {
    RunOptions {
        model: "tiny".into(),
        batch,
        seq: 8,
        seed: 5,
        sampling: Sampling::Random,
        schedule: Schedule {
            lr: 1e-3,
            warmup: 0,
            steps: 3,
            decay: Decay::Cosine,
        },
        accumulate,
        clip_grad_norm: Some(1.0),
        weight_decay: 0.01,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        decay_vectors: false,
        precision: "f32".into(),
        device: "cpu".into(),
        val_fraction: 0.1,
        val_every: 0,
        val_batches: 0,
        save_every: 0,
        keep: 1,
        memory_budget: None,
        ranks,
    }
}

struct Fixture {
    dir: tempfile::TempDir,
    data: PathBuf,
    params: Named,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("tokens.bin");
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        let ids: Vec<u8> = (0..6000)
            .flat_map(|_| rng.random_range(0..97u16).to_le_bytes())
            .collect();
        std::fs::write(&data, ids).unwrap();
        let params = random_parameters(&ModelConfig::tiny(), 3, DType::F32, |_| {}).unwrap();
        Fixture { dir, data, params }
    }

    /// A session of `options`; `name` its run directory (`None`: it writes nothing).
    fn session(
        &self,
        options: RunOptions,
        name: Option<&str>,
        world: Option<Arc<dyn Communicator>>,
    ) -> Result<Session> {
        self.session_on(options, name, world, None)
    }

    /// The same with the train step's `streams`.
    fn session_on(
        &self,
        options: RunOptions,
        name: Option<&str>,
        world: Option<Arc<dyn Communicator>>,
        streams: Option<usize>,
    ) -> Result<Session> {
        let data = TokenData::open(&self.data, None, 97)?;
        let run_dir = name.map(|n| {
            let dir = self.dir.path().join(n);
            std::fs::create_dir_all(&dir).unwrap();
            dir
        });
        let start = Start {
            params: self.params.clone(),
            moments: None,
            step: 0,
        };
        Session::new(
            &Backend::Cpu,
            (RunMode::Eager, streams),
            (ModelConfig::tiny(), options),
            data,
            start,
            (run_dir, None),
            world,
        )
    }
}

#[test]
fn data_parallel_ranks_train_as_one_process_on_the_combined_batch() {
    let fixture = Fixture::new();
    for accumulate in [1, 2] {
        let mut whole = fixture
            .session(options(4, 1, accumulate), Some("whole"), None)
            .unwrap();
        let want: Vec<StepRecord> = (0..3).map(|_| whole.train_step().unwrap()).collect();
        let (want_params, want_moments) = whole.state().unwrap();

        let ranks = World::ranks(2).unwrap();
        let got = std::thread::scope(|s| {
            let handles: Vec<_> = (ranks.into_iter().enumerate())
                .map(|(rank, world)| {
                    let fixture = &fixture;
                    s.spawn(move || {
                        let world: Arc<dyn Communicator> = Arc::new(world);
                        let name = (rank == 0).then_some("ranks");
                        let mut session = fixture
                            .session(options(2, 2, accumulate), name, Some(world))
                            .unwrap();
                        let records: Vec<StepRecord> =
                            (0..3).map(|_| session.train_step().unwrap()).collect();
                        (records, session.state().unwrap())
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        });
        for (rank, (records, (params, moments))) in got.iter().enumerate() {
            for (g, w) in records.iter().zip(&want) {
                // The mean of the ranks' losses, and the combined batch's token count.
                assert!(
                    (g.loss - w.loss).abs() <= 1e-5 * w.loss,
                    "rank {rank}: {g:?} vs {w:?}"
                );
                assert_eq!(g.tokens, w.tokens);
                let (gn, wn) = (g.grad_norm.unwrap(), w.grad_norm.unwrap());
                assert!(
                    (gn - wn).abs() <= 1e-4 * wn,
                    "rank {rank}: norm {gn} vs {wn}"
                );
            }
            for ((name, g), (_, w)) in params
                .iter()
                .chain(moments)
                .zip(want_params.iter().chain(&want_moments))
            {
                let (g, w) = (g.to_f64_vec().unwrap(), w.to_f64_vec().unwrap());
                let scale = w.iter().fold(1e-30f64, |m, x| m.max(x.abs()));
                for (a, b) in g.iter().zip(&w) {
                    assert!(
                        (a - b).abs() <= 1e-4 * scale,
                        "accumulate {accumulate}, rank {rank} {name}: {a} vs {b}"
                    );
                }
            }
        }
        // Rank 0 wrote the metrics; rank 1 had nothing to write to.
        let metrics = fixture
            .dir
            .path()
            .join("ranks")
            .join(crate::metrics::METRICS_FILE);
        assert_eq!(std::fs::read_to_string(metrics).unwrap().lines().count(), 3);
        std::fs::remove_dir_all(fixture.dir.path().join("ranks")).unwrap();
        std::fs::remove_dir_all(fixture.dir.path().join("whole")).unwrap();
    }
}

#[test]
fn a_run_of_several_ranks_needs_its_world() {
    let fixture = Fixture::new();
    let error = fixture
        .session(options(2, 2, 1), None, None)
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.contains("takes 2 data-parallel ranks (each step 4 rows of --batch 2), not 1"),
        "{error}"
    );
}

#[test]
fn a_train_step_on_two_streams_gives_one_streams_bits() {
    let fixture = Fixture::new();
    let bits = |t: &Tensor| -> Vec<u64> {
        t.to_f64_vec()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect()
    };
    for accumulate in [1, 2] {
        let run = |streams| {
            let options = options(2, 1, accumulate);
            let mut session = fixture
                .session_on(options, None, None, Some(streams))
                .unwrap();
            let losses: Vec<u64> = (0..3)
                .map(|_| session.train_step().unwrap().loss.to_bits())
                .collect();
            let (params, moments) = session.state().unwrap();
            let state: Vec<Vec<u64>> = params
                .iter()
                .chain(&moments)
                .map(|(_, t)| bits(t))
                .collect();
            (losses, state)
        };
        assert_eq!(run(2), run(1), "accumulate {accumulate}");
    }
}

#[test]
fn the_streams_are_checked() {
    let fixture = Fixture::new();
    let refusal = |world: Option<Arc<dyn Communicator>>, streams| {
        let ranks = world.as_ref().map_or(1, |w| w.world_size());
        let session = fixture.session_on(options(2, ranks, 1), None, world, Some(streams));
        session.err().unwrap().to_string()
    };
    let zero = refusal(None, 0);
    assert!(
        zero.contains("--streams") && zero.contains("at least 1"),
        "{zero}"
    );
    let world: Arc<dyn Communicator> = Arc::new(World::ranks(1).unwrap().remove(0));
    let ranks = refusal(Some(world), 2);
    assert!(
        ranks.contains("--streams") && ranks.contains("data-parallel"),
        "{ranks}"
    );
}
