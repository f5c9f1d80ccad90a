//! Offloaded plans for the CUDA backend: `memc emit` lists their copies and host updates
//! apart from the kernels, and the backend's check takes them.
#![allow(clippy::unwrap_used)]

mod common;

/// `memc emit` of an offloaded plan writes the device steps' kernels and lists the copies
/// (with the bytes they move, as many as the report's transfers) and the host updates apart,
/// none of them as a kernel.
#[test]
fn emit_lists_the_copies_and_host_updates_apart_from_the_kernels() {
    let dir = common::scratch("offload-emit");
    let out = common::memc(&[
        "emit",
        common::MLP,
        "--offload",
        "optimizer",
        "-o",
        dir.to_str().unwrap(),
    ]);
    common::assert_success(&out);
    let text = std::fs::read_to_string(dir.join("manifest.json")).unwrap();
    let manifest: serde_json::Value = serde_json::from_str(&text).unwrap();
    let entries = manifest.as_array().unwrap();
    let named = |key: &str| -> Vec<&serde_json::Value> {
        entries.iter().filter(|e| e.get(key).is_some()).collect()
    };
    let kernels = named("kernel");
    assert!(!kernels.is_empty());
    for k in &kernels {
        let name = k["kernel"].as_str().unwrap();
        assert!(!name.contains("copy") && !name.contains("adamw"), "{name}");
    }
    let transfers: Vec<&str> = named("transfer")
        .iter()
        .map(|e| e["transfer"].as_str().unwrap())
        .collect();
    assert_eq!(transfers, ["copy_to_host", "copy_to_device"]);
    let hosts: Vec<&str> = named("host")
        .iter()
        .map(|e| e["host"].as_str().unwrap())
        .collect();
    assert_eq!(hosts, ["adamw"]);
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("plan.json")).unwrap()).unwrap();
    let moved: u64 = named("transfer")
        .iter()
        .map(|e| e["bytes"].as_u64().unwrap())
        .sum();
    let report = &plan["report"]["transfers"];
    assert_eq!(
        moved,
        report["to_host"].as_u64().unwrap() + report["to_device"].as_u64().unwrap()
    );
    let copies: usize = named("transfer")
        .iter()
        .map(|e| e["steps"].as_array().unwrap().len())
        .sum();
    assert_eq!(copies as u64, report["copies"].as_u64().unwrap());
}

/// The CUDA backend's check takes an offloaded plan built for it (its host arena is
/// page-locked host memory and its copies run on a copy stream) and still names a missing
/// driver.
#[test]
fn the_cuda_backend_takes_offloaded_plans() {
    let source = std::fs::read_to_string(common::MLP).unwrap();
    let options = memc::Options {
        target: memc::plan::Target::Cuda { sm: (9, 0) },
        offload: Some(memc::settings::Offload::All),
        ..Default::default()
    };
    let compiled = memc::compile(&source, &options).unwrap();
    let plan = compiled.plan.plan();
    assert!(plan.host_bytes > 0);
    assert!(memc::exec::cuda_can_run(plan, true).is_ok());
    let err = memc::exec::cuda_can_run(plan, false).unwrap_err();
    assert!(err.to_string().contains("no CUDA driver"), "{err}");
}

/// Under a budget a CUDA plan weighs offload as a CPU plan does: GPT-2 small in bf16 at
/// 2 GiB (its arena plus the CUDA context's stated 529 MiB) fits only with something in
/// host memory, and the least estimated time keeps the optimizer state there.
#[test]
fn a_cuda_budget_weighs_offload() {
    let out = common::memc(&[
        "compile",
        "examples/gpt2.mdl",
        "--device",
        "cuda",
        "--precision",
        "bf16",
        "--budget",
        "2GiB",
    ]);
    common::assert_success(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("keeps the optimizer state in host memory (--offload optimizer"),
        "{err}"
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("1,564,835,844"), "{text}");
    assert!(
        text.contains("host arena: 1.2 GiB (1,304,297,472 bytes"),
        "{text}"
    );
}
