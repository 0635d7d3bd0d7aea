//! The CSV dump: one row per buffer, in buffer order, for spreadsheets and scripts.
//!
//! Header `id,name,class,offset,size,start,end,uses`; `offset` is empty for buffers outside
//! the arena; class names are the JSON ones. Fields that contain a comma, a double quote or a
//! line break are quoted and their quotes doubled (RFC 4180); records end in `\n`.

use super::class_name;
use crate::Plan;

/// The CSV dump (see the module doc).
pub fn to_csv(plan: &Plan) -> String {
    let mut csv = String::from("id,name,class,offset,size,start,end,uses\n");
    for b in &plan.buffers {
        let fields = [
            b.id.to_string(),
            quote(&b.name),
            class_name(b.class).to_string(),
            b.offset.map_or(String::new(), |offset| offset.to_string()),
            b.size.to_string(),
            b.start.to_string(),
            b.end.to_string(),
            b.uses.to_string(),
        ];
        csv.push_str(&fields.join(","));
        csv.push('\n');
    }
    csv
}

/// `field` as one CSV field: as is, or quoted when it holds a separator, quote or line break.
fn quote(field: &str) -> String {
    if field.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", field.replace('"', "\"\""))
    } else {
        field.to_string()
    }
}
