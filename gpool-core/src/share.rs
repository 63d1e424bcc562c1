//! Fractions of a GPU: what a job asks for (`--gpu-mem 20G`,
//! `--gpu-fraction 0.25`, `--gpu-share 30%`), what that comes to on one
//! GPU, and which shared GPU takes it.
//!
//! A shared GPU holds jobs whose memory together stays within what its
//! driver leaves usable, and whose compute shares stay within 100%. A
//! fraction goes to the shared GPU it fits best (the least memory left
//! after it), and only where none takes it to a whole free GPU, which the
//! scheduler picks as it picks any one-GPU placement (the fullest node
//! first, so whole nodes stay whole for gangs).

use serde::{Deserialize, Serialize};

/// A fraction of one GPU, as asked: by memory or by a fraction of the
/// GPU's usable memory (exactly one of the two), and a compute share.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ShareAsk {
    /// MiB of GPU memory; 0: by `fraction_milli`.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub memory_mib: u64,
    /// Thousandths of the GPU's usable memory; 0: by `memory_mib`.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub fraction_milli: u32,
    /// Percent of the GPU's streaming multiprocessors; 0: no cap.
    #[serde(default, skip_serializing_if = "is_zero_u8")]
    pub compute_pct: u8,
}

fn is_zero_u64(value: &u64) -> bool {
    *value == 0
}

fn is_zero_u32(value: &u32) -> bool {
    *value == 0
}

fn is_zero_u8(value: &u8) -> bool {
    *value == 0
}

/// What a fraction comes to on one GPU: the memory its client may pin, its
/// compute cap, and the part of the GPU it is charged for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Share {
    pub memory_mib: u64,
    /// 0: no cap (it competes for all the GPU's compute).
    pub compute_pct: u8,
    /// Thousandths of the GPU it holds: the larger of its memory's part of
    /// the usable memory and its compute share. Guarantees, fair share,
    /// budgets and reports count its GPU-hours times this.
    pub milli: u32,
}

impl Share {
    /// The part of a GPU it holds: what each of its GPU-hours counts.
    pub fn part(&self) -> f64 {
        f64::from(self.milli) / 1000.0
    }
}

/// How the pool shares GPUs (`[sharing]` of the policy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareRules {
    /// Memory asks are rounded up to this (MiB).
    pub granularity_mib: u64,
    /// Jobs of different users may share one GPU (and its MPS server).
    pub mixed_users: bool,
}

impl Default for ShareRules {
    fn default() -> ShareRules {
        ShareRules {
            granularity_mib: 1024,
            mixed_users: false,
        }
    }
}

impl ShareAsk {
    /// `0.25`, `.5`, `25%`: a fraction above 0 and below 1, in thousandths.
    pub fn parse_fraction(text: &str) -> Result<u32, String> {
        let text = text.trim();
        let value = match text.strip_suffix('%') {
            Some(percent) => percent.trim().parse::<f64>().map(|p| p / 100.0),
            None => text.parse::<f64>(),
        }
        .map_err(|_| format!("{text:?} is not a fraction such as 0.25 or 25%"))?;
        let milli = (value * 1000.0).round();
        if !(1.0..1000.0).contains(&milli) {
            return Err(format!("{text:?} is not above 0 and below 1 (a whole GPU is --gpus 1)"));
        }
        Ok(milli as u32)
    }

    /// `30%` or `30`: a compute share from 1 to 100 percent.
    pub fn parse_compute(text: &str) -> Result<u8, String> {
        let text = text.trim();
        match text.trim_end_matches('%').trim().parse::<u8>() {
            Ok(pct @ 1..=100) => Ok(pct),
            _ => Err(format!("{text:?} is not a compute share from 1% to 100%")),
        }
    }

    /// What it comes to on a GPU with `usable_mib` of memory (its memory
    /// less what the driver keeps); `None` where it does not fit one.
    pub fn on(&self, usable_mib: u64, rules: &ShareRules) -> Option<Share> {
        let grain = rules.granularity_mib.max(1);
        let memory_mib = if self.memory_mib > 0 {
            self.memory_mib.div_ceil(grain) * grain
        } else {
            // A fraction rounds down, so four quarters fit.
            (usable_mib * u64::from(self.fraction_milli) / 1000) / grain * grain
        };
        if memory_mib == 0 || memory_mib > usable_mib {
            return None;
        }
        let memory_milli = (memory_mib * 1000).div_ceil(usable_mib.max(1));
        let milli = memory_milli.max(u64::from(self.compute_pct) * 10).min(1000) as u32;
        Some(Share {
            memory_mib,
            compute_pct: self.compute_pct,
            milli,
        })
    }
}

/// One shared GPU: its usable memory and what the jobs on it hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SharedGpu {
    pub usable_mib: u64,
    pub used_mib: u64,
    /// Compute shares asked (jobs without a cap count nothing).
    pub used_pct: u32,
    pub jobs: u32,
    /// Whose jobs run on it (for `ShareRules::mixed_users`).
    pub users: Vec<String>,
}

impl SharedGpu {
    pub fn new(usable_mib: u64) -> SharedGpu {
        SharedGpu {
            usable_mib,
            ..SharedGpu::default()
        }
    }

    pub fn free_mib(&self) -> u64 {
        self.usable_mib.saturating_sub(self.used_mib)
    }

    /// Whether `share` of `user`'s fits beside what it holds.
    pub fn takes(&self, share: &Share, user: &str, rules: &ShareRules) -> bool {
        share.memory_mib <= self.free_mib()
            && self.used_pct + u32::from(share.compute_pct) <= 100
            && (rules.mixed_users || self.users.iter().all(|other| other == user))
    }

    pub fn add(&mut self, share: &Share, user: &str) {
        self.used_mib += share.memory_mib;
        self.used_pct += u32::from(share.compute_pct);
        self.jobs += 1;
        if !self.users.iter().any(|other| other == user) {
            self.users.push(user.to_string());
        }
    }

    /// Takes back what `add` added (a job on it ended); `users` keeps the
    /// user until the GPU is free (a view is rebuilt from running jobs).
    pub fn remove(&mut self, share: &Share) {
        self.used_mib = self.used_mib.saturating_sub(share.memory_mib);
        self.used_pct = self.used_pct.saturating_sub(u32::from(share.compute_pct));
        self.jobs = self.jobs.saturating_sub(1);
        if self.jobs == 0 {
            self.users.clear();
        }
    }
}

/// Of the shared GPUs `candidates` (a key each), the one `ask` of `user`'s
/// fits best: the least memory left after it, then the first. With it,
/// what the ask comes to there.
pub fn best_fit<'a, K: Copy>(
    ask: &ShareAsk,
    user: &str,
    rules: &ShareRules,
    candidates: impl IntoIterator<Item = (K, &'a SharedGpu)>,
) -> Option<(K, Share)> {
    candidates
        .into_iter()
        .filter_map(|(key, gpu)| {
            let share = ask.on(gpu.usable_mib, rules)?;
            gpu.takes(&share, user, rules)
                .then(|| (gpu.free_mib().saturating_sub(share.memory_mib), key, share))
        })
        .min_by_key(|(left, _, _)| *left)
        .map(|(_, key, share)| (key, share))
}

#[cfg(test)]
mod tests;
