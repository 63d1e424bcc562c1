//! What gpool's man pages add to clap's.

/// What every man page adds to clap's: EXIT STATUS and ENVIRONMENT (the
/// README's tables, in roff).
const MAN_SECTIONS: &str = r#".SH "EXIT STATUS"
.TP
0
Success.
.TP
1
The controller refused or failed the request (an unknown job id, a permission); for cancel, some id was left alone.
.TP
2
Bad usage or input: a flag, a job file, a spec the controller refused.
.TP
69
The controller could not be reached (the address tried is printed).
.TP
3, 124, 125, 130
submit \-\-wait and wait: a job failed (exited non\-zero, was killed, never started, lost its node), ran out of time, or was cancelled (the first such job in submit order decides), or waiting was interrupted. submit \-\-attach, run and alloc exit with the job's own code instead (128+N for signal N), as srun and salloc do.
.TP
141
Standard output was closed before gpool was done.
.SH ENVIRONMENT
.TP
GPOOL_SERVER
The controller's address (HOST:PORT, https://HOST:PORT or unix:PATH), as \-\-server.
.TP
GPOOL_TOKEN
The caller's token (else ~/.config/gpool/token).
.TP
GPOOL_CA
The cluster CA that the controller's certificate must chain to (else ~/.config/gpool/ca.pem).
.TP
GPOOL_TIMEOUT
How long to wait for an answer, as \-\-timeout (default 30s).
"#;

/// Appends `MAN_SECTIONS` to every page `clap_mangen` wrote in `dir`.
pub fn add_man_sections(dir: &std::path::Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|ext| ext == "1") {
            let mut page = std::fs::read_to_string(&path)?;
            page.push_str(MAN_SECTIONS);
            std::fs::write(&path, page)?;
        }
    }
    Ok(())
}
