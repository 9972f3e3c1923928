//! `free-ports`: prints N free loopback ports, a helper for
//! `scripts/bench.sh` to place its servers on.

use clap::Args;

#[derive(Args)]
pub(super) struct FreePortsArgs {
    count: usize,
}

pub(super) fn free_ports(args: FreePortsArgs) -> anyhow::Result<()> {
    let listeners = (0..args.count)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()?;
    let ports: Vec<String> = listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port().to_string()))
        .collect::<Result<_, _>>()?;
    println!("{}", ports.join(" "));
    Ok(())
}
