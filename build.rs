//! Compiles `proto/externalscaler.proto` with protox (a pure-Rust protobuf
//! compiler), so a bare machine needs no system `protoc`. The encoded
//! descriptor set is kept for gRPC server reflection.

use std::{env, fs, path::PathBuf};

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/externalscaler.proto";
    println!("cargo:rerun-if-changed={proto}");

    let descriptors = protox::compile([proto], ["proto"])?;
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    fs::write(
        out_dir.join("externalscaler_descriptor.bin"),
        descriptors.encode_to_vec(),
    )?;

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
