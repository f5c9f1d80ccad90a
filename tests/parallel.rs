//! Data parallelism with ZeRO 0-3: N ranks train as one rank with the whole batch (up to
//! float summation order), replicas stay bitwise identical, each stage's per-rank bytes are
//! exact, and the ZeRO paper's model-state table beside memc's own figures.
#![allow(clippy::panic, clippy::unwrap_used)]

mod common;

use common::{compiled_with, example, memc, overrides};
use memc::exec::ranks::Ranks;
use memc::parallel::{paper_model_states, Parallel};
use memc::plan::RankBytes;
use memc::settings::Precision;
use memc::Options;

const GPT: &[(&str, i64)] = &[("L", 2), ("D", 64), ("T", 32), ("V", 256), ("H", 4)];
const LLAMA: &[(&str, i64)] = &[
    ("L", 2),
    ("D", 64),
    ("T", 16),
    ("V", 128),
    ("H", 4),
    ("F", 96),
];

fn options(dims: &[(&str, i64)], batch: i64, precision: Precision) -> Options {
    let mut dims = dims.to_vec();
    dims.push(("B", batch));
    Options {
        overrides: overrides(&dims),
        precision: Some(precision),
        ..Options::default()
    }
}

fn parallel(data: u32, zero: u8, global_batch: bool) -> Option<Parallel> {
    Some(Parallel {
        data,
        zero,
        global_batch,
        ..Parallel::default()
    })
}

/// Every ZeRO stage over 4 ranks of batch 2 prints the losses of one rank of batch 8, on
/// a small GPT and a small LLaMA, in fp32 and bf16 (bf16 within its rounding: the ranks
/// round their partial gradients before the mean).
#[test]
fn four_ranks_train_as_one_rank_with_the_whole_batch() {
    for (model, dims) in [("gpt2", GPT), ("llama7b", LLAMA)] {
        for (precision, tolerance) in [(Precision::Fp32, 2e-6), (Precision::Bf16, 5e-5)] {
            let one = common::rank_losses(model, &options(dims, 8, precision), 3);
            for zero in 0..=3 {
                let split = Options {
                    parallel: parallel(4, zero, false),
                    ..options(dims, 2, precision)
                };
                let four = common::rank_losses(model, &split, 3);
                for (step, (a, b)) in one.iter().zip(&four).enumerate() {
                    let close = (a - b).abs() <= tolerance * a.abs();
                    assert!(
                        close,
                        "{model} {precision:?} ZeRO-{zero} step {step}: {a} vs {b}"
                    );
                }
            }
        }
    }
}

/// `batch = global` splits the model's batch dim over the ranks: data = 2 on B = 8 runs
/// plans of B = 4 and prints what one rank of B = 8 does.
#[test]
fn a_global_batch_is_split_over_the_ranks() {
    let whole = options(GPT, 8, Precision::Fp32);
    let split = Options {
        parallel: parallel(2, 1, true),
        ..whole.clone()
    };
    let plan = compiled_with(&example("gpt2"), &split).plan;
    let tokens = &plan.plan().inputs[0];
    let shape = &plan.plan().buffers[tokens.buffer.index()].ty.shape;
    assert_eq!(shape, &vec![4, 32]);
    let (one, two) = (
        common::rank_losses("gpt2", &whole, 2),
        common::rank_losses("gpt2", &split, 2),
    );
    for (a, b) in one.iter().zip(&two) {
        assert!((a - b).abs() <= 2e-6 * a.abs(), "{a} vs {b}");
    }
}

/// Under ZeRO 0, 1 and 2 every rank holds every parameter, and after training they are the
/// same bits on every rank (the collectives sum in rank order); under ZeRO-3 each rank
/// holds a different shard of the same size.
#[test]
fn replicas_hold_the_same_bits() {
    for zero in 0..=3 {
        let o = Options {
            parallel: parallel(3, zero, false),
            ..options(GPT, 2, Precision::Bf16)
        };
        let c = compiled_with(&example("gpt2"), &o);
        let mut ranks = Ranks::new(&c.plan).unwrap();
        ranks.start(5).unwrap();
        for _ in 0..2 {
            ranks.run_step().unwrap();
        }
        let [first, rest @ ..] = ranks.executors() else {
            panic!("no ranks");
        };
        assert_eq!(rest.len(), 2);
        for p in &c.plan.plan().params {
            let mine = first.read(p.buffer).to_vec();
            for other in rest {
                let theirs = other.read(p.buffer).to_vec();
                let same = mine
                    .iter()
                    .map(|v| v.to_bits())
                    .eq(theirs.iter().map(|v| v.to_bits()));
                assert_eq!(same, zero < 3, "ZeRO-{zero} {}", p.name);
            }
        }
    }
}

/// Runs `memc COMMAND examples/gpt2.mdl` at the small GPT's dims with B = 2, then `extra`.
fn memc_gpt(command: &str, extra: &[&str]) -> std::process::Output {
    let dims: Vec<String> = GPT
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .chain(["B=2".to_string()])
        .collect();
    let mut args = vec![command, "examples/gpt2.mdl"];
    for d in &dims {
        args.extend(["--set", d.as_str()]);
    }
    args.extend(extra);
    memc(&args)
}

fn rank_bytes(model: &str, o: &Options) -> (RankBytes, (u64, u64), usize) {
    let plan = compiled_with(&example(model), o).plan;
    let Some(p) = plan.plan().report.parallel.clone() else {
        panic!("no parallel report");
    };
    assert!(p.per_rank.iter().all(|r| r.bytes == p.per_rank[0].bytes));
    assert!(p
        .per_rank
        .iter()
        .enumerate()
        .all(|(i, r)| r.rank as usize == i));
    let uneven = (p.uneven_tensors, p.padding_elements);
    (p.per_rank[0].bytes, uneven, p.per_rank.len())
}

/// Exact per-rank bytes of the small GPT (118,528 parameters) over 4 ranks: ZeRO-1 shards
/// the optimizer state (every rank holds the whole all-reduced gradient), ZeRO-2 also the
/// gradients, ZeRO-3 also the parameters.
#[test]
fn each_stage_shards_what_it_says() {
    let expected = [
        (474_112, 474_112, 948_224, 65_536, 2_028_804),
        (474_112, 474_112, 237_056, 65_536, 1_443_844),
        (474_112, 118_528, 237_056, 16_384, 1_443_844),
        (118_528, 118_528, 237_056, 132_096, 970_500),
    ];
    for (zero, (params, grads, optimizer, comm, arena)) in expected.into_iter().enumerate() {
        let o = Options {
            parallel: parallel(4, zero as u8, false),
            ..options(GPT, 2, Precision::Fp32)
        };
        let (b, padding, ranks) = rank_bytes("gpt2", &o);
        assert_eq!(ranks, 4);
        assert_eq!(padding, (0, 0));
        assert_eq!(
            (
                b.params,
                b.grads,
                b.optimizer,
                b.activations,
                b.comm,
                b.arena
            ),
            (params, grads, optimizer, 344_320, comm, arena),
            "ZeRO-{zero}"
        );
    }
}

/// Over 3 ranks the GPT's tensors do not divide: the shards are padded, and the report says
/// by how much.
#[test]
fn uneven_shards_are_padded_and_reported() {
    let o = Options {
        parallel: parallel(3, 3, false),
        ..options(GPT, 2, Precision::Fp32)
    };
    let (b, padding, ranks) = rank_bytes("gpt2", &o);
    assert_eq!(ranks, 3);
    // 39,525 elements a rank: 47 zeros over the 24 tensors 3 does not divide (the
    // embeddings, every norm's weight and bias, and the linear layers of 4,096, 16,384,
    // 64 and 256 elements).
    assert_eq!((b.params, padding), (158_100, (24, 47)));
    let out = memc_gpt("compile", &["--parallel", "data=3,zero=3"]);
    common::assert_success(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("uneven shards: 24 parameters do not divide by 3; their shards are padded to equal size (47 zero elements over all ranks)"),
        "{text}"
    );
}

/// The ZeRO paper's per-device model states for its 7.5B-parameter, 64-GPU example (K = 12),
/// by its accounting, beside memc's exact per-rank figures for a LLaMA of 7,547,949,056
/// parameters (LLaMA-7B's shape with 36 layers) in bf16 with fp32 master weights and AdamW
/// over 64 ranks. Under ZeRO-1 and 2 each rank keeps the whole bf16 copy of every weight
/// that matmuls read (2 bytes a parameter) and its 1/64 of their fp32 masters with the
/// moments (12 bytes), gradients in bf16: the paper's accounting to the byte for those
/// 7,416,578,048 parameters. The embedding table and the RMSNorm weights (131,371,008) are
/// read by fp32 ops (the residual stream is fp32), so they stay fp32 and whole, with fp32
/// gradients and sharded moments. ZeRO-0 and 3 keep 16 bytes a parameter, whole or sharded,
/// as the paper counts.
#[test]
fn zero_paper_table_and_memc_beside_it() {
    let paper = [0, 1, 2, 3].map(|s| paper_model_states(7_500_000_000, 12, 64, s));
    assert_eq!(
        paper,
        [
            120_000_000_000,
            31_406_250_000,
            16_640_625_000,
            1_875_000_000
        ]
    );
    let dims = [("L", 36), ("T", 128), ("B", 1)];
    let (all, fp32) = (7_547_949_056u64, 131_371_008u64);
    let copies = all - fp32;
    // The fp32 tensors under the older scheme: whole parameters, whole (ZeRO-1) or sharded
    // (ZeRO-2) fp32 gradients, sharded moments.
    let fp32_states =
        |stage: u64| 4 * fp32 + [4 * fp32, 4 * fp32 / 64][stage as usize - 1] + 8 * fp32 / 64;
    let expected: [(u64, u64, u64, u64); 4] = [
        (
            30_191_796_224,
            30_191_796_224,
            60_383_592_448,
            92_094_251_524,
        ),
        (
            15_358_640_128,
            15_358_640_128,
            1_407_029_760,
            17_822_437_892,
        ),
        (15_358_640_128, 239_978_752, 1_407_029_760, 17_510_407_428),
        (471_746_816, 471_746_816, 943_493_632, 2_411_905_796),
    ];
    for (zero, want) in expected.into_iter().enumerate() {
        let o = Options {
            overrides: overrides(&dims),
            precision: Some(Precision::Bf16),
            parallel: parallel(64, zero as u8, false),
            ..Options::default()
        };
        let plan = compiled_with(&example("llama7b"), &o).plan;
        // The model's parameters, whichever part of them a rank holds.
        assert_eq!(plan.plan().report.trainable_param_count, all);
        let (b, _, ranks) = rank_bytes("llama7b", &o);
        assert_eq!(ranks, 64);
        assert_eq!(
            (b.params, b.grads, b.optimizer, b.arena),
            want,
            "ZeRO-{zero}"
        );
        let states = b.params + b.grads + b.optimizer;
        let by_paper = match zero {
            0 | 3 => paper_model_states(all, 12, 64, zero as u8),
            z => paper_model_states(copies, 12, 64, z as u8) + fp32_states(z as u64),
        };
        assert_eq!(states, by_paper, "ZeRO-{zero}");
    }
}

/// The command line: `--parallel` prints every rank's bytes (JSON: 64 entries with each
/// part), a bad value is a diagnostic pointing into the flag (exit 2), and `run` refuses
/// what it cannot do with several ranks.
#[test]
fn the_command_line_prints_and_refuses() {
    let args = [
        "compile",
        "examples/llama7b.mdl",
        "--precision",
        "bf16",
        "--parallel",
        "data=64,zero=3",
    ];
    let out = memc(&args);
    common::assert_success(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("parallel: data = 64, ZeRO-3: 64 rank(s), 1 role(s)"),
        "{text}"
    );
    assert!(
        text.contains("ranks 0-63 (data-parallel ZeRO-3 shard): params 401.6 MiB"),
        "{text}"
    );
    let json = memc(&[&args[..], &["--format", "json"]].concat());
    common::assert_success(&json);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let per_rank = &v["report"]["parallel"]["per_rank"];
    assert_eq!(per_rank.as_array().map(Vec::len), Some(64));
    assert_eq!(per_rank[63]["rank"], 63);
    assert_eq!(per_rank[63]["role"], "data-parallel ZeRO-3 shard");
    assert_eq!(per_rank[0]["bytes"]["params"], 421_150_976u64);
    for part in [
        "params",
        "grads",
        "optimizer",
        "activations",
        "comm",
        "peak",
        "arena",
    ] {
        assert!(per_rank[0]["bytes"][part].is_u64(), "{part}");
    }
    let bad = memc(&["compile", "examples/mlp.mdl", "--parallel", "data=8,zero=5"]);
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("`zero` is a ZeRO stage: 0, 1, 2 or 3"),
        "{err}"
    );
    assert!(err.contains("data=8,zero=5"), "{err}");
    let cuda = memc(&[
        "run",
        "examples/mlp.mdl",
        "--device",
        "cuda",
        "--parallel",
        "data=2",
    ]);
    assert_eq!(cuda.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&cuda.stderr).contains("--device cpu"));
    let dump = memc(&[
        "run",
        "examples/mlp.mdl",
        "--parallel",
        "data=2",
        "--dump",
        "x",
    ]);
    assert_eq!(dump.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&dump.stderr).contains("--dump reads or writes one device"));
}

/// A parallel plan for a GPU states NCCL's reserve beside the CUDA context's, and the
/// device total holds all three.
#[test]
fn a_gpu_plan_states_the_nccl_reserve() {
    let o = Options {
        target: memc::plan::Target::CUDA_MIN,
        parallel: parallel(8, 3, false),
        ..options(GPT, 2, Precision::Bf16)
    };
    let plan = compiled_with(&example("gpt2"), &o).plan;
    let r = &plan.plan().report;
    let Some(d) = r.device else {
        panic!("no device bytes");
    };
    assert_eq!(d.nccl_reserve, memc::cost::NCCL_RESERVE);
    assert_eq!(d.nccl_reserve, 512 << 20);
    assert_eq!(d.total, d.arena + d.context_reserve + d.nccl_reserve);
    assert_eq!(
        r.parallel.as_ref().and_then(|p| p.nccl_reserve),
        Some(512 << 20)
    );
    assert_eq!(r.budgeted_bytes(), d.total);
}

/// The settings data parallelism combines with train as one rank with the whole batch too:
/// SGD with momentum and global-norm clipping under ZeRO 0 and 1, fp16 loss scaling under
/// ZeRO-1, LoRA adapters sharded under ZeRO-3 (the frozen base stays whole), and pure bf16
/// (bf16 parameters, no masters) under ZeRO-3.
#[test]
fn other_settings_train_alike() {
    let sgd = example("gpt2").replace(
        "optimizer = adamw(lr = 3e-4, betas = (0.9, 0.95), eps = 1e-8, weight_decay = 0.1)",
        "optimizer = sgd(lr = 0.1, momentum = 0.9)\n    clip_grad_norm = 0.5",
    );
    assert!(sgd.contains("clip_grad_norm"));
    let lora = memc::passes::lora::LoraSpec::parse("r=4").unwrap();
    let cases: [(&str, Options, &[u8], f32); 4] = [
        (&sgd, options(GPT, 8, Precision::Fp32), &[0, 1], 2e-6),
        (
            &example("gpt2"),
            options(GPT, 8, Precision::Fp16),
            &[1],
            2e-6,
        ),
        (
            &example("gpt2"),
            Options {
                lora: Some(lora),
                ..options(GPT, 8, Precision::Fp32)
            },
            &[3],
            2e-6,
        ),
        (
            &example("gpt2"),
            Options {
                master_weights: Some(false),
                ..options(GPT, 8, Precision::Bf16)
            },
            &[3],
            1e-4,
        ),
    ];
    for (src, whole, stages, tolerance) in cases {
        let run = |o: &Options| {
            let c = compiled_with(src, o);
            let mut ranks = Ranks::new(&c.plan).unwrap();
            ranks.start(3).unwrap();
            (0..3)
                .map(|_| ranks.run_step().unwrap().unwrap_or(f32::NAN))
                .collect::<Vec<f32>>()
        };
        let one = run(&whole);
        for &zero in stages {
            let mut split = Options {
                parallel: parallel(4, zero, false),
                ..whole.clone()
            };
            split.overrides.push(("B".into(), 2));
            for (a, b) in one.iter().zip(run(&split)) {
                assert!(
                    (a - b).abs() <= tolerance * a.abs(),
                    "ZeRO-{zero}: {a} vs {b}"
                );
            }
        }
    }
}

/// `memc fit --ranks`: the fewest ranks, then the lowest stage, then the fewest tensor
/// ranks, whose per-rank plan fits; every layout tried on the way is listed, and a budget
/// nothing meets is an error listing them all. At 1000 KiB the small GPT fits on 4 ranks
/// split Megatron's way (tensor = 4), before ZeRO-3 over 4 data-parallel ranks is tried.
#[test]
fn fit_finds_the_fewest_ranks() {
    use memc::fit_ranks::{fewest_ranks, RanksFitError};
    let src = example("gpt2");
    let o = options(GPT, 2, Precision::Fp32);
    let found = fewest_ranks(&src, &o, 1000 << 10, 16).unwrap();
    let tensor_4 = Parallel {
        tensor: 4,
        ..Parallel::default()
    };
    assert_eq!(found.parallel, tensor_4);
    assert_eq!(found.plan.plan().report.budgeted_bytes(), FIT_BYTES);
    let tried: Vec<(u32, u32, u8, bool)> = found
        .probes
        .iter()
        .map(|p| (p.data, p.tensor, p.zero, p.bytes.is_some()))
        .collect();
    let mut expected = vec![(1, 1, 0, false), (2, 1, 0, false), (1, 2, 0, false)];
    expected.extend((1..4).map(|zero| (2, 1, zero, false)));
    expected.extend([(4, 1, 0, false), (2, 2, 0, false), (1, 4, 0, true)]);
    assert_eq!(tried, expected);
    let Err(RanksFitError::Infeasible { max_ranks, probes }) =
        fewest_ranks(&src, &o, 400 << 10, 16)
    else {
        panic!("400 KiB fitted");
    };
    // 1 layout of 1 rank, 5 of 2, 9 of 4, 13 of 8 and 16 of 16; tensor = 8 does not
    // divide the 4 heads.
    assert_eq!((max_ranks, probes.len()), (16, 44));
    for p in probes {
        let why = p.refusal.unwrap_or_default();
        let heads = why.contains("does not divide the 4 heads");
        assert_eq!(heads, p.tensor == 8, "{why}");
        assert!(heads || why.contains("no plan fits"), "{why}");
    }
    let out = memc_gpt("fit", &["--budget", "1000KiB", "--ranks", "16"]);
    common::assert_success(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with(&format!("fit ranks: the fewest within 1000.0 KiB per device is data = 1, ZeRO-0, tensor = 4 (--parallel data=1,zero=0,tensor=4): {FIT_TEXT} per rank")),
        "{text}"
    );
}

/// The budgeted bytes of the small GPT over tensor = 4, and as `memc fit` prints them.
const FIT_BYTES: u64 = 858_628;
const FIT_TEXT: &str = "838.5 KiB (858,628 bytes)";

/// Under ZeRO-3 every gather of a parameter in forward is freed by the end of forward
/// (after its last forward reader), backward gathers again what it reads, and the gathered
/// bytes live at once stay below the whole model's: parameters are whole only while used.
#[test]
fn zero_3_gathers_just_in_time() {
    let o = Options {
        parallel: parallel(4, 3, false),
        ..options(LLAMA, 2, Precision::Bf16)
    };
    let plan = compiled_with(&example("llama7b"), &o).plan;
    let plan = plan.plan();
    let phase = memc::ir::Phase::Forward;
    let Some(last_forward) = plan.steps.iter().rposition(|s| s.phase == phase) else {
        panic!("no forward");
    };
    let gathers = |forward: bool| {
        plan.steps
            .iter()
            .filter(move |s| matches!(s.op, memc::ir::Op::AllGather { .. }))
            .filter(move |s| (s.phase == phase) == forward)
    };
    let mut whole = 0;
    for s in gathers(true) {
        let Some(out) = s.output else {
            panic!("a gather without output");
        };
        let b = &plan.buffers[out.index()];
        assert!(b.last <= last_forward, "{} lives into backward", b.name);
        whole += b.bytes;
    }
    // 2 layers of 7 weights and 2 norms, the embedding, the final norm and the head.
    assert_eq!(gathers(true).count(), 21);
    assert!(
        gathers(false).count() >= 14,
        "backward gathers {}",
        gathers(false).count()
    );
    let Some(p) = &plan.report.parallel else {
        panic!("no parallel report");
    };
    assert!(
        p.per_rank[0].bytes.comm < whole,
        "{} of {whole}",
        p.per_rank[0].bytes.comm
    );
}

/// Under ZeRO-1 with bf16 every matmul weight is a bf16 parameter whose fp32 master shard is
/// optimizer state with its role, and every trained parameter names its reduced gradient.
#[test]
fn zero_1_keeps_16bit_copies_and_master_shards() {
    let o = Options {
        parallel: parallel(4, 1, false),
        ..options(GPT, 2, Precision::Bf16)
    };
    let c = compiled_with(&example("gpt2"), &o);
    let plan = c.plan.plan();
    let masters: Vec<&str> = (plan.params.iter())
        .filter_map(|p| {
            let m = &plan.buffers[p.master?.index()];
            let of = memc::plan::Role::MasterWeights { of: p.name.clone() };
            assert_eq!(
                (m.role.as_ref(), m.ty.shape[0] * 4),
                (
                    Some(&of),
                    plan.buffers[p.buffer.index()].ty.numel() as usize
                )
            );
            Some(p.name.as_str())
        })
        .collect();
    // Per layer: qkv, proj, fc and fc_proj, weights and biases; embeddings and norms stay fp32.
    assert_eq!(masters.len(), 16, "{masters:?}");
    assert!(plan.params.iter().all(|p| p.grad.is_some()));
}
