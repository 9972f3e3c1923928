//! The results line: every measuring subcommand prints one JSON object on
//! standard output, which `scripts/bench.sh` collects and `report` reads.

use serde_json::Value;

pub(crate) fn emit(result: Value) {
    println!("{result}");
}
