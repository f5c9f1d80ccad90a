//! An offloaded plan's copies on the CUDA backend's two streams: the estimate lays the step
//! out as the backend issues it (a copy waits for the kernels it conflicts with, and they
//! for it).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

mod common;

use common::{compiled_with, example};
use memc::cost::{estimate, stream_time, Gpu};
use memc::plan::Plan;
use memc::settings::{Offload, Precision};
use memc::Options;

fn gpt2_bf16(offload: Offload) -> memc::Compiled {
    let options = Options {
        precision: Some(Precision::Bf16),
        offload: Some(offload),
        gpu: Some(Gpu::H100),
        layout_time: std::time::Duration::ZERO,
        ..Options::default()
    };
    compiled_with(&example("gpt2"), &options)
}

/// Each plan step's estimated device time (zero off the device).
fn device_times(plan: &Plan, gpu: Gpu) -> Vec<f64> {
    let mut times = vec![0.0; plan.steps.len()];
    for t in estimate(plan, gpu).steps {
        times[t.step] += t.seconds;
    }
    times
}

/// The extra time is what the two streams add to the device's own time: at least the
/// copies the device's time cannot cover, at most all of them; with copies that take no
/// time the two streams take the device's time.
#[test]
fn the_estimate_lays_the_copies_out_on_two_streams() {
    for offload in [Offload::Activations, Offload::Optimizer, Offload::All] {
        let c = gpt2_bf16(offload);
        let plan = c.plan.plan();
        let e = estimate(plan, Gpu::H100);
        let o = e.offload.clone().expect("an offload estimate");
        let device = e.compute_bound_seconds + e.memory_bound_seconds + e.launch_seconds;
        let off = o.transfer_seconds + o.host_update_seconds;
        let slack = 1e-9 * (device + off);
        assert!(
            o.extra_seconds + slack >= (off - device).max(0.0),
            "{offload:?}: {o:?}"
        );
        assert!(o.extra_seconds <= off + slack, "{offload:?}: {o:?}");
        let none = vec![0.0; plan.steps.len()];
        let alone = stream_time(plan, &device_times(plan, Gpu::H100), &none);
        assert!(
            (alone - device).abs() <= slack,
            "{offload:?}: {alone} vs {device}"
        );
        println!(
            "gpt2 bf16 {offload:?}: device {:.3} ms, copies {:.3} ms, host {:.3} ms, \
             overlapped {:.3} ms, extra {:.3} ms",
            device * 1e3,
            o.transfer_seconds * 1e3,
            o.host_update_seconds * 1e3,
            o.overlapped_seconds * 1e3,
            o.extra_seconds * 1e3
        );
    }
}

/// GPT-2 small, bf16, activations offloaded: a copy runs beside a kernel only where the
/// stream order lets it (after the last earlier kernel it conflicts with, before the first
/// later one that waits for it), so the estimate hides no more of the copies than those
/// windows hold. Today's layout gives them little room: a copied-out activation's bytes go
/// to the next kernel that writes, and a prefetch's free up shortly before its reader.
#[test]
fn the_estimate_hides_copies_only_where_the_stream_order_lets_them_run() {
    use memc::ir::Op;
    use memc::plan::copy_order::copy_order;
    let c = gpt2_bf16(Offload::Activations);
    let plan = c.plan.plan();
    let order = copy_order(plan);
    let device = device_times(plan, Gpu::H100);
    let link = Gpu::H100.spec().host_link.bandwidth;
    let mut room = 0.0;
    for (s, step) in plan.steps.iter().enumerate() {
        if !matches!(step.op, Op::CopyToHost | Op::CopyFromHost) {
            continue;
        }
        let b = step.output.expect("a copy writes a buffer");
        let copy = plan.buffers[b.index()].ty.bytes() as f64 / link + memc::cost::LAUNCH_OVERHEAD_S;
        let after = order.copy_waits[s].map_or(0, |t| t + 1);
        let before = (s + 1..plan.steps.len())
            .find(|&t| order.compute_waits[t].contains(&s))
            .unwrap_or(plan.steps.len());
        room += copy.min(device[after..before].iter().sum::<f64>());
    }
    let o = estimate(plan, Gpu::H100)
        .offload
        .expect("an offload estimate");
    println!(
        "gpt2 bf16 activations: {:.3} ms hidden, {:.3} ms the stream order allows",
        o.overlapped_seconds * 1e3,
        room * 1e3
    );
    assert!(o.overlapped_seconds <= room * (1.0 + 1e-9));
    assert!(o.overlapped_seconds < 0.5 * o.transfer_seconds);
}
