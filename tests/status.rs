//! What `status` shows: who uses which GPU, how much, since when, and how
//! sure it is, in a table that fits 120 columns.

use gpureap::incident::{Holder, Incident, SimHost};

use crate::harness::*;

fn host(gpus: u32) -> SimHost {
    SimHost::new(gpus, 80 * GIB, "Simulated H200").expect("sim host")
}

#[test]
fn a_process_younger_than_a_second_shows_its_age_in_tenths() {
    let host = host(1);
    let mut incident = Incident::new(&host);
    let holder = incident
        .holder(&Holder::new("python3 young.py").on(0, GIB))
        .expect("holder");
    let table = run(&host, &["status"]);
    let row = table
        .stdout
        .lines()
        .find(|line| line.split_whitespace().nth(1) == Some(&holder.to_string()))
        .unwrap_or_else(|| panic!("no row for {holder}:\n{}", table.stdout));
    let age = row.split_whitespace().nth(7).expect("age column");
    let tenths = age
        .strip_suffix('s')
        .and_then(|seconds| seconds.split_once('.'))
        .is_some_and(|(whole, tenth)| {
            whole.bytes().all(|b| b.is_ascii_digit()) && tenth.len() == 1
        });
    assert!(tenths, "age {age:?} in: {row}");
}
