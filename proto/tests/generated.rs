//! The committed generated code must match what the .proto file generates.
//! Run with `GPOOL_BLESS=1` to rewrite `src/gen/` after changing the .proto.

use std::path::Path;

#[test]
fn generated_code_is_up_to_date() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out_dir = tempfile::tempdir().expect("temp dir");
    let protoc = protoc_bin_vendored::protoc_bin_path().expect("vendored protoc for this platform");
    // tonic-prost-build finds protoc through this variable.
    std::env::set_var("PROTOC", protoc);
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // No `Client::connect` constructor: it would clash with AgentLink.Connect.
        .build_transport(false)
        // Held with its specs encoded, decoded one at a time by gpoold.
        .extern_path(".gpool.v1.SubmitJobsRequest", "crate::submit::SubmitJobsRequest")
        // Sent with its jobs encoded where gpoold reads them.
        .extern_path(".gpool.v1.ListJobsResponse", "crate::listing::ListJobsResponse")
        .emit_rerun_if_changed(false)
        .out_dir(out_dir.path())
        .file_descriptor_set_path(out_dir.path().join("gpool.fds"))
        .compile_protos(&[crate_dir.join("gpool/v1/gpool.proto")], &[crate_dir.to_path_buf()])
        .expect("protoc compiles gpool.proto");
    let fresh = std::fs::read_to_string(out_dir.path().join("gpool.v1.rs")).expect("generated file");
    held_messages_are_as_declared(&out_dir.path().join("gpool.fds"));
    let committed_path = crate_dir.join("src/gen/gpool.v1.rs");
    if std::env::var_os("GPOOL_BLESS").is_some() {
        std::fs::write(&committed_path, &fresh).expect("write generated code");
        return;
    }
    let committed = std::fs::read_to_string(&committed_path).unwrap_or_default();
    assert!(
        committed == fresh,
        "src/gen/gpool.v1.rs is stale: run `GPOOL_BLESS=1 cargo test -p gpool-proto --test generated`"
    );
}

/// `SubmitJobsRequest` and `ListJobsResponse` are written by hand
/// (`src/submit.rs`, `src/listing.rs`), with the fields the .proto gives
/// them, and the listing adds entries of `Job.reasons` by its number: a
/// change to any of these there must be made here too.
fn held_messages_are_as_declared(descriptors: &Path) {
    use prost::Message;
    let bytes = std::fs::read(descriptors).expect("descriptor set");
    let set = prost_types::FileDescriptorSet::decode(bytes.as_slice()).expect("descriptor set decodes");
    // Each field's name, number, type and whether it is repeated.
    let fields = |name: &str| -> Vec<(String, i32, String, bool)> {
        let message = set
            .file
            .iter()
            .flat_map(|file| &file.message_type)
            .find(|message| message.name() == name)
            .unwrap_or_else(|| panic!("{name} in gpool.proto"));
        message
            .field
            .iter()
            .map(|field| {
                let repeated = field.label() == prost_types::field_descriptor_proto::Label::Repeated;
                (
                    field.name().to_string(),
                    field.number(),
                    field.type_name().to_string(),
                    repeated,
                )
            })
            .collect()
    };
    let repeated = |name: &str, number: i32, type_name: &str| (name.to_string(), number, type_name.to_string(), true);
    assert_eq!(
        fields("SubmitJobsRequest"),
        [repeated("specs", 1, ".gpool.v1.JobSpec")],
        "SubmitJobsRequest changed in gpool.proto: change src/submit.rs to match"
    );
    assert_eq!(
        fields("ListJobsResponse"),
        [repeated("jobs", 1, ".gpool.v1.Job")],
        "ListJobsResponse changed in gpool.proto: change src/listing.rs to match"
    );
    assert!(
        fields("Job").contains(&repeated("reasons", 34, ".gpool.v1.Reason")),
        "Job.reasons changed in gpool.proto: change JOB_REASONS_TAG in src/listing.rs to match"
    );
}
