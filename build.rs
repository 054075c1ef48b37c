//! Builds the small C++ shim of the PyTorch allocator hook (csrc/torch_shim.cpp), only with the
//! cargo feature `python`: Rust users never need a C++ compiler.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "python")]
    {
        println!("cargo:rerun-if-changed=csrc/torch_shim.cpp");
        cc::Build::new()
            .cpp(true)
            .file("csrc/torch_shim.cpp")
            .flag_if_supported("-std=c++17")
            .flag_if_supported("-fvisibility=hidden")
            .warnings(true)
            .compile("rrmm_torch_shim");
    }
}
