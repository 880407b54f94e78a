//! Many hosts from one seat: `status`, `free`, `wait` and `plan` with `-H LIST`
//! run the same command on each host through the user's own ssh, with
//! `--json` (the services' `remote` transport), and merge the answers into
//! one report (the services' `remote::render`; docs/fleet.md): `commands`
//! builds each host's command line, `push` installs gpureap on the hosts.

pub mod commands;
pub mod push;
