//! A fraction of one GPU: `--gpu-mem`, `--gpu-fraction`, `--gpu-share`.

#[derive(clap::Args, Default)]
pub struct ShareArgs {
    /// A fraction of one GPU, by its memory (20G): the job shares a GPU
    /// with other fractions, and its memory is capped at this (MPS).
    #[arg(long, value_name = "SIZE", conflicts_with_all = ["gpus", "gpus_per_node", "gres", "nodes", "exclusive"])]
    pub gpu_mem: Option<String>,
    /// A fraction of one GPU, as a part of its memory (0.25 or 25%).
    #[arg(long, value_name = "FRACTION", conflicts_with_all = ["gpu_mem", "gpus", "gpus_per_node", "gres", "nodes", "exclusive"])]
    pub gpu_fraction: Option<String>,
    /// With --gpu-mem or --gpu-fraction: at most this share of the GPU's
    /// compute (30%).
    #[arg(long, value_name = "PERCENT")]
    pub gpu_share: Option<String>,
}
