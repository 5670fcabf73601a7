//! `tend schema`

use std::io::{self, Write};

use super::exit;
use crate::model::schema::declaration_schema;

pub(super) fn run() -> io::Result<u8> {
    let mut out = io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, &declaration_schema())?;
    writeln!(out)?;
    Ok(exit::OK)
}
