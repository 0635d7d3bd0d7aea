//! The committed header `include/kiln.h` is what cbindgen makes of the ABI source today.
//! `KILN_BLESS_HEADER=1 cargo test -p kiln-capi --test header` rewrites it after a deliberate
//! change (which, if it breaks compiled callers, also bumps `KILN_ABI_VERSION`).

use std::path::Path;

#[test]
fn committed_header_matches_the_abi_source() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml"))
        .expect("capi/cbindgen.toml parses");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut generated);
    let generated = String::from_utf8(generated).expect("the header is UTF-8");
    let path = crate_dir.join("include/kiln.h");
    if std::env::var_os("KILN_BLESS_HEADER").is_some() {
        std::fs::write(&path, &generated).expect("write include/kiln.h");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "capi/include/kiln.h differs from what cbindgen generates from capi/src/abi; after a \
         deliberate ABI change run KILN_BLESS_HEADER=1 cargo test -p kiln-capi --test header \
         (and bump KILN_ABI_VERSION if compiled callers break)"
    );
}
