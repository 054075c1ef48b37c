//! Builds the small C++ shim of the PyTorch allocator hook (csrc/torch_shim.cpp), only with the
//! cargo feature `python`: Rust users never need a C++ compiler.
//!
//! The shim is built without C++ exceptions: it throws only through PyTorch's own C++ runtime
//! (found at run time), and none of its frames may have a personality routine of the C++ runtime
//! it is linked with (zig's libc++abi in a release wheel), which PyTorch's unwinder would call.
//! Its unwind tables are kept: PyTorch's exceptions unwind through its frames. The test caller
//! (csrc/torch_shim_test_caller.cpp, for rrmm's Rust tests) catches, so it keeps exceptions.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "python")]
    {
        println!("cargo:rerun-if-changed=csrc/torch_shim.cpp");
        println!("cargo:rerun-if-changed=csrc/torch_shim_test_caller.cpp");
        cc::Build::new()
            .cpp(true)
            .file("csrc/torch_shim.cpp")
            .flag_if_supported("-std=c++17")
            .flag_if_supported("-fvisibility=hidden")
            .flag("-fno-exceptions")
            .flag("-fno-rtti")
            .flag("-funwind-tables")
            .warnings(true)
            .compile("rrmm_torch_shim");
        cc::Build::new()
            .cpp(true)
            .file("csrc/torch_shim_test_caller.cpp")
            .flag_if_supported("-std=c++17")
            .flag_if_supported("-fvisibility=hidden")
            .warnings(true)
            .compile("rrmm_torch_shim_test_caller");
    }
}
