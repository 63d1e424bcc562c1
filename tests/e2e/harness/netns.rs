//! "Other hosts" for tests: a bridge in the test's own network namespace
//! and, per host, a network namespace joined to it by a veth pair, each
//! with its own address. Created by the test and removed on drop; needs
//! root (`ip netns`), so `Net::create` says why it cannot where it cannot.

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

static NEXT_NET: AtomicU32 = AtomicU32::new(0);

pub struct Net {
    /// Names are short: Linux allows 15 characters for an interface.
    tag: String,
    /// The first three octets of the subnet, e.g. "10.213.7".
    prefix: String,
    hosts: Vec<String>,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let output = Command::new("ip")
        .args(args)
        .output()
        .map_err(|err| format!("ip: {err}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

impl Net {
    /// A bridge with address `<prefix>.1/24`, or the reason there is none.
    pub fn create() -> Result<Net, String> {
        if !nix::unistd::geteuid().is_root() {
            return Err("network namespaces need root".into());
        }
        let n = NEXT_NET.fetch_add(1, Ordering::Relaxed);
        let id = (std::process::id() % 4096) * 16 + n % 16;
        let net = Net {
            tag: format!("gp{id:x}"),
            prefix: format!("10.{}.{}", 200 + (id / 250) % 50, id % 250),
            hosts: Vec::new(),
        };
        let bridge = net.bridge();
        ip(&["link", "add", &bridge, "type", "bridge"])?;
        ip(&["addr", "add", &format!("{}/24", net.gateway()), "dev", &bridge])?;
        ip(&["link", "set", &bridge, "up"])?;
        Ok(net)
    }

    fn bridge(&self) -> String {
        format!("{}b", self.tag)
    }

    /// The address of this (the controller's) side of the bridge.
    pub fn gateway(&self) -> String {
        format!("{}.1", self.prefix)
    }

    /// A new host: its namespace's name and address.
    pub fn add_host(&mut self) -> Result<(String, String), String> {
        let host_idx = self.hosts.len() + 2;
        let namespace = format!("{}h{host_idx}", self.tag);
        let (outside, inside) = (format!("{}v{host_idx}", self.tag), format!("{}i{host_idx}", self.tag));
        let address = format!("{}.{host_idx}", self.prefix);
        ip(&["netns", "add", &namespace])?;
        self.hosts.push(namespace.clone());
        ip(&["link", "add", &outside, "type", "veth", "peer", "name", &inside])?;
        ip(&["link", "set", &inside, "netns", &namespace])?;
        ip(&["link", "set", &outside, "master", &self.bridge(), "up"])?;
        let in_ns = |args: &[&str]| {
            let mut all = vec!["netns", "exec", &namespace, "ip"];
            all.extend_from_slice(args);
            ip(&all)
        };
        in_ns(&["addr", "add", &format!("{address}/24"), "dev", &inside])?;
        in_ns(&["link", "set", &inside, "up"])?;
        in_ns(&["link", "set", "lo", "up"])?;
        Ok((namespace, address))
    }

    /// Cuts (`connected` false) or restores the link of host `namespace`
    /// to the bridge: a real link-down, as a switch port failing is.
    pub fn set_connected(&self, namespace: &str, connected: bool) -> Result<(), String> {
        let host_idx = self
            .hosts
            .iter()
            .position(|host| host == namespace)
            .ok_or_else(|| format!("{namespace} is not a host of this net"))?
            + 2;
        let outside = format!("{}v{host_idx}", self.tag);
        ip(&["link", "set", &outside, if connected { "up" } else { "down" }])
    }

    /// The address range of the bridge, e.g. "10.213.7.0/24".
    pub fn range(&self) -> String {
        format!("{}.0/24", self.prefix)
    }

    /// `command` run inside `namespace` (its pid stays the program's:
    /// `ip netns exec` execs it).
    pub fn command_in(namespace: &str, program: &std::path::Path) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", namespace]).arg(program);
        command
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for namespace in &self.hosts {
            let _ = ip(&["netns", "del", namespace]);
        }
        let _ = ip(&["link", "del", &self.bridge()]);
    }
}
