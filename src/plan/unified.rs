//! Unified memory (`--unified`, `train { unified = true }`): the plan's arena as one CUDA
//! managed allocation (`cudaMallocManaged`) on a device of a stated capacity, and what the
//! driver's demand paging would do to it in one training step.
//!
//! The model, stated: the arena is paged in [`PAGE_BYTES`] pages (the driver's large-page
//! granularity); the device holds as many pages as the capacity leaves beside the CUDA
//! context; a step touches every page of its inputs, output and workspace, and each touched
//! page that is not resident faults and migrates to the device, evicting the least recently
//! touched page (LRU) when the device is full; an evicted page migrates to the host whether
//! or not its bytes are still live (the driver cannot tell). The figures are the steady
//! state: the step's sequence (forward and backward once per micro-batch, then the update)
//! simulated twice, the second pass counted, so the parameters and optimizer state paged out
//! at the end of one step fault back in the next.

use super::{Buffer, Plan};
use crate::cost::Gpu;
use crate::ir::Phase;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fmt::Write;

/// The page the model migrates and evicts: 2 MiB, the driver's large-page granularity.
pub const PAGE_BYTES: u64 = 2 << 20;

/// Seconds each page fault stalls the faulting kernel beyond its migration: the GPU's fault,
/// the driver's servicing of it and the migration's setup. An assumption (published unified
/// memory measurements put fault servicing at tens of microseconds), not a measurement.
pub const FAULT_LATENCY_S: f64 = 20e-6;

/// What unified memory would do to a plan's arena on a device of `capacity` bytes: exact
/// page counts under the stated model (module docs), and an estimated time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Unified {
    /// The device's bytes: the budget, or the GPU's memory without one.
    pub capacity: u64,
    /// Of them, the CUDA context's (not available to the arena).
    pub context_reserve: u64,
    /// The page size of the model ([`PAGE_BYTES`]).
    pub page_bytes: u64,
    /// Pages of the arena the device holds at once: `(capacity - context_reserve) / page`.
    pub device_pages: u64,
    /// Pages the arena spans.
    pub arena_pages: u64,
    /// Bytes of the arena that are never all resident at once: the arena's pages beyond the
    /// device's, in bytes (0 when the arena fits).
    pub paged_out: u64,
    /// The step with the most live bytes (the first such).
    pub peak_step: usize,
    /// Live bytes at that step (`report.bytes.peak`).
    pub peak_live: u64,
    /// Bytes of the pages holding live bytes at the peak that are resident there.
    pub peak_resident: u64,
    /// Bytes of the pages holding live bytes at the peak that are on the host there.
    pub peak_on_host: u64,
    /// Live bytes at the peak beyond what the device holds: on the host at the peak under
    /// any eviction order.
    pub peak_over: u64,
    /// Page faults in one step (steady state).
    pub faults: u64,
    /// Page faults in one step under the best eviction order (Belady's: the page needed
    /// furthest ahead evicted first, the pages of the running step kept): what no eviction
    /// policy beats, and what planned copies could approach.
    pub optimal_faults: u64,
    /// Pages evicted in one step (steady state).
    pub evictions: u64,
    /// Bytes migrated host to device in one step: `faults` pages.
    pub to_device: u64,
    /// Bytes migrated device to host in one step: `evictions` pages.
    pub to_host: u64,
    /// Steps that alone touch more pages than the device holds (their kernels thrash).
    pub overcommitted_steps: u64,
    /// The steps that fault, in plan order, with the pages each faults per training step.
    pub faulting: Vec<FaultingStep>,
    /// What the faults add to the step on the GPU.
    pub time: FaultTime,
}

impl Unified {
    /// The faults' estimated time on `gpu`: the pages migrated both ways at its host link's
    /// bandwidth plus [`FAULT_LATENCY_S`] a fault.
    pub fn fault_seconds(&self, gpu: Gpu) -> f64 {
        let link = gpu.spec().host_link.bandwidth;
        (self.to_device + self.to_host) as f64 / link + self.faults as f64 * FAULT_LATENCY_S
    }
}

/// A plan step that touches pages that are not resident when it runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FaultingStep {
    /// The step's index in the plan.
    pub step: usize,
    /// The step's op, by name.
    pub op: String,
    /// The step's phase (forward and backward steps run once per micro-batch).
    pub phase: Phase,
    /// The step's scope (`layer.3.attn`).
    pub scope: String,
    /// Pages it faults in one training step (over all its runs).
    pub pages: u64,
}

/// The estimated time the faults add to a step: an estimate from the stated link and
/// latency figures, never a measurement. Faults stall the kernel that takes them, so
/// nothing overlaps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FaultTime {
    /// The GPU whose host link the pages cross.
    pub gpu: Gpu,
    /// The link in words (`PCIe 5.0 x16`).
    pub link: String,
    /// The link's assumed bandwidth in bytes/s, one direction.
    pub link_bandwidth: f64,
    /// The assumed stall of each fault ([`FAULT_LATENCY_S`]).
    pub fault_latency: f64,
    /// `(to_device + to_host) / link_bandwidth + faults * fault_latency`.
    pub seconds: f64,
}

/// The least recently touched resident pages, evicted first.
struct Lru {
    /// When each page was last touched, if resident.
    touched: Vec<Option<u64>>,
    /// The resident pages by last touch.
    order: BTreeSet<(u64, u64)>,
    frames: u64,
}

impl Lru {
    /// Touches `page` at time `now`: whether it faulted and whether a page was evicted.
    fn touch(&mut self, page: u64, now: u64) -> (bool, bool) {
        let Some(slot) = self.touched.get_mut(page as usize) else {
            return (false, false);
        };
        if let Some(last) = slot.replace(now) {
            self.order.remove(&(last, page));
            self.order.insert((now, page));
            return (false, false);
        }
        if self.frames == 0 {
            *slot = None;
            return (true, false);
        }
        let mut evicted = false;
        if self.order.len() as u64 >= self.frames {
            if let Some((_, victim)) = self.order.pop_first() {
                self.touched[victim as usize] = None;
                evicted = true;
            }
        }
        self.order.insert((now, page));
        (true, evicted)
    }

    fn resident(&self, page: u64) -> bool {
        self.touched.get(page as usize).is_some_and(Option::is_some)
    }
}

/// The pages `buffer` spans.
fn pages(buffer: &Buffer) -> std::ops::Range<u64> {
    match buffer.bytes {
        0 => 0..0,
        b => buffer.offset / PAGE_BYTES..(buffer.offset + b).div_ceil(PAGE_BYTES),
    }
}

/// The distinct pages of the arena that `step` of `plan` touches: those of its inputs, its
/// output and its workspace, in increasing order.
pub fn step_pages(plan: &Plan, step: &super::Step) -> Vec<u64> {
    let ids = (step.inputs.iter())
        .chain(&step.output)
        .chain(&step.workspace);
    let mut p: Vec<u64> = ids
        .filter_map(|b| plan.buffers.get(b.index()))
        .flat_map(pages)
        .collect();
    p.sort_unstable();
    p.dedup();
    p
}

/// The steps of one training step in the order they run: forward and backward once per
/// micro-batch, then the update.
fn run_order(plan: &Plan) -> Vec<usize> {
    let micro = plan.micro_steps() as usize;
    let steps = 0..plan.steps.len();
    let update = |s: &usize| plan.steps[*s].phase == Phase::Update;
    match micro {
        1 => steps.collect(),
        _ => (0..micro)
            .flat_map(|_| steps.clone().filter(|s| !update(s)))
            .chain(steps.clone().filter(update))
            .collect(),
    }
}

/// What unified memory does to `plan`'s arena on a device of `capacity` bytes of which
/// `reserve` are the CUDA context's, with the faults' time estimated on `gpu`'s host link.
pub fn report(plan: &Plan, (capacity, reserve): (u64, u64), gpu: Gpu) -> Unified {
    let frames = capacity.saturating_sub(reserve) / PAGE_BYTES;
    let arena_pages = plan.arena_bytes.div_ceil(PAGE_BYTES);
    let touched: Vec<Vec<u64>> = plan.steps.iter().map(|s| step_pages(plan, s)).collect();
    let live = plan.live_per_step();
    let peak_step = (0..live.len())
        .max_by_key(|&s| (live[s], std::cmp::Reverse(s)))
        .unwrap_or(0);
    let peak_live = live.get(peak_step).copied().unwrap_or(0);
    let mut lru = Lru {
        touched: vec![None; arena_pages as usize],
        order: BTreeSet::new(),
        frames,
    };
    let order = run_order(plan);
    let (mut faults, mut evictions, mut now) = (vec![0u64; plan.steps.len()], 0u64, 0u64);
    let mut at_peak = None;
    for pass in 0..2 {
        for &s in &order {
            now += 1;
            for &page in &touched[s] {
                let (fault, evicted) = lru.touch(page, now);
                if pass == 1 {
                    faults[s] += u64::from(fault);
                    evictions += u64::from(evicted);
                }
            }
            if pass == 1 && s == peak_step && at_peak.is_none() {
                at_peak = Some(peak_pages(plan, peak_step, &lru));
            }
        }
    }
    let (peak_resident, peak_on_host) = at_peak.unwrap_or((0, 0));
    let total: u64 = faults.iter().sum();
    let link = gpu.spec().host_link;
    let mut unified = Unified {
        capacity,
        context_reserve: reserve,
        page_bytes: PAGE_BYTES,
        device_pages: frames,
        arena_pages,
        paged_out: arena_pages.saturating_sub(frames) * PAGE_BYTES,
        peak_step,
        peak_live,
        peak_resident,
        peak_on_host,
        peak_over: peak_live.saturating_sub(frames * PAGE_BYTES),
        faults: total,
        optimal_faults: optimal_faults(&touched, &order, frames),
        evictions,
        to_device: total * PAGE_BYTES,
        to_host: evictions * PAGE_BYTES,
        overcommitted_steps: touched.iter().filter(|p| p.len() as u64 > frames).count() as u64,
        faulting: (faults.iter().enumerate())
            .filter(|&(_, &n)| n > 0)
            .map(|(s, &n)| FaultingStep {
                step: s,
                op: plan.steps[s].op.name().to_string(),
                phase: plan.steps[s].phase,
                scope: plan.steps[s].scope.clone(),
                pages: n,
            })
            .collect(),
        time: FaultTime {
            gpu,
            link: link.name.to_string(),
            link_bandwidth: link.bandwidth,
            fault_latency: FAULT_LATENCY_S,
            seconds: 0.0,
        },
    };
    unified.time.seconds = unified.fault_seconds(gpu);
    unified
}

/// Page faults of the second of two runs of `order` (each step touching its `touched`
/// pages) on `frames` pages under Belady's eviction: the resident page whose next touch is
/// furthest ahead (or never) is evicted first, except the pages of the step running, which
/// it needs at once. The touches of a third run give the second's last pages their next use.
fn optimal_faults(touched: &[Vec<u64>], order: &[usize], frames: u64) -> u64 {
    let steps: Vec<usize> = (0..3).flat_map(|_| order.iter().copied()).collect();
    let accesses: Vec<u64> = (steps.iter())
        .flat_map(|&s| touched[s].iter().copied())
        .collect();
    let mut next = vec![usize::MAX; accesses.len()];
    let mut seen = std::collections::HashMap::new();
    for (i, &page) in accesses.iter().enumerate().rev() {
        if let Some(j) = seen.insert(page, i) {
            next[i] = j;
        }
    }
    let pass = accesses.len() / 3;
    // Resident pages keyed by their next touch (0 while their step runs), and each page's key.
    let mut resident: BTreeSet<(usize, u64)> = BTreeSet::new();
    let mut key = std::collections::HashMap::new();
    let (mut faults, mut i) = (0u64, 0usize);
    for &s in &steps {
        let first = i;
        for &page in &touched[s] {
            let fault = match key.remove(&page) {
                Some(k) => !resident.remove(&(k, page)),
                None => true,
            };
            if fault && frames > 0 && resident.len() as u64 >= frames {
                if let Some((_, victim)) = resident.pop_last() {
                    key.remove(&victim);
                }
            }
            if frames > 0 {
                resident.insert((0, page));
                key.insert(page, 0);
            }
            faults += u64::from(fault && (pass..2 * pass).contains(&i));
            i += 1;
        }
        for (j, &page) in (first..i).zip(&touched[s]) {
            if key.get(&page) == Some(&0) && resident.remove(&(0, page)) {
                resident.insert((next[j], page));
                key.insert(page, next[j]);
            }
        }
    }
    faults
}

/// The bytes of the pages holding live bytes at step `s` that are resident, and those
/// that are not.
fn peak_pages(plan: &Plan, s: usize, lru: &Lru) -> (u64, u64) {
    let mut live: Vec<u64> = (plan.buffers.iter())
        .filter(|b| b.view_of.is_none() && b.tier.is_device() && b.first <= s && s <= b.last)
        .flat_map(pages)
        .collect();
    live.sort_unstable();
    live.dedup();
    let resident = live.iter().filter(|&&p| lru.resident(p)).count() as u64;
    (
        resident * PAGE_BYTES,
        (live.len() as u64 - resident) * PAGE_BYTES,
    )
}

/// The unified-memory lines of the report (nothing for a plan without unified memory).
pub fn render(out: &mut String, plan: &Plan) {
    let Some(u) = &plan.report.unified else {
        return;
    };
    let (h, g) = (super::human_bytes, super::grouped);
    let _ = writeln!(
        out,
        "  unified memory (cudaMallocManaged) on {}: capacity {} ({} bytes) less the CUDA context's {} leaves {} pages of {} for the arena's {} pages",
        u.time.gpu.spec().name,
        h(u.capacity),
        g(u.capacity),
        h(u.context_reserve),
        g(u.device_pages),
        h(u.page_bytes),
        g(u.arena_pages)
    );
    let _ = writeln!(
        out,
        "    paged out: {} bytes of the arena are on the host at any time; at the peak (step {}, {} bytes live) {} bytes of live pages resident, {} bytes on the host (at least {} bytes under any eviction)",
        g(u.paged_out),
        u.peak_step,
        g(u.peak_live),
        g(u.peak_resident),
        g(u.peak_on_host),
        g(u.peak_over)
    );
    let by_phase = |phase: Phase| -> u64 {
        (u.faulting.iter())
            .filter(|f| f.phase == phase)
            .map(|f| f.pages)
            .sum()
    };
    let _ = writeln!(
        out,
        "    page faults per step (steady state, LRU over {} pages): {} in {} steps (forward {}, backward {}, update {}), {} host->device; {} evictions, {} device->host{}; the best eviction order would take {} faults; the most:",
        h(u.page_bytes),
        g(u.faults),
        u.faulting.len(),
        g(by_phase(Phase::Forward)),
        g(by_phase(Phase::Backward)),
        g(by_phase(Phase::Update)),
        h(u.to_device),
        g(u.evictions),
        h(u.to_host),
        match u.overcommitted_steps {
            0 => String::new(),
            n => format!("; {n} steps alone touch more pages than the device holds (they thrash)"),
        },
        g(u.optimal_faults)
    );
    let mut most: Vec<&FaultingStep> = u.faulting.iter().collect();
    most.sort_by_key(|f| (std::cmp::Reverse(f.pages), f.step));
    for f in most.iter().take(5) {
        let scope = match f.scope.as_str() {
            "" => String::new(),
            s => format!(" in {s}"),
        };
        let _ = writeln!(
            out,
            "      step {} ({}, {}{scope}): {} pages",
            f.step,
            f.op,
            format!("{:?}", f.phase).to_lowercase(),
            g(f.pages)
        );
    }
    let t = &u.time;
    let _ = writeln!(
        out,
        "    estimated fault time on {}: {} over {} ({:.0} GB/s assumed) + {} faults x {:.0} us (assumed) = {} a step (an estimate, not a measurement)",
        t.gpu.spec().name,
        h(u.to_device + u.to_host),
        t.link,
        t.link_bandwidth / 1e9,
        g(u.faults),
        t.fault_latency * 1e6,
        crate::cost::ms(t.seconds)
    );
}
