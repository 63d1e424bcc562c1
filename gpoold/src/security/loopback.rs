//! Who is on the other end of a loopback TCP connection. The kernel knows
//! each TCP socket's owner: gpoold asks it for the one socket whose local
//! address is our peer and whose remote address is us, by netlink's
//! sock_diag (one lookup, however many sockets the host has), and reads
//! `/proc/net/tcp{,6}` only where sock_diag cannot answer. That uid is as
//! trustworthy as the Unix socket's peer credentials, and never what the
//! caller claims.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A plaintext TCP connection, with the uid owning the client's socket
/// where the client is on this host (loopback).
pub struct PlainTcp {
    pub stream: TcpStream,
    pub info: PlainTcpInfo,
}

/// What the gRPC server attaches to each request of a plaintext connection.
#[derive(Debug, Clone, Copy)]
pub struct PlainTcpInfo {
    pub remote: SocketAddr,
    /// The client socket's owner, for loopback peers.
    pub local_uid: Option<u32>,
}

impl PlainTcp {
    pub fn new(stream: TcpStream, remote: SocketAddr) -> PlainTcp {
        let local_uid = match stream.local_addr() {
            Ok(local) if remote.ip().is_loopback() => socket_owner(remote, local),
            _ => None,
        };
        PlainTcp {
            stream,
            info: PlainTcpInfo { remote, local_uid },
        }
    }
}

/// The uid of the socket bound to `client` and connected to `server`.
fn socket_owner(client: SocketAddr, server: SocketAddr) -> Option<u32> {
    match sock_diag_owner(client, server) {
        Ok(owner) => owner,
        Err(_) => proc_table_owner(client, server),
    }
}

/// Asks the kernel for the one TCP socket `client` -> `server` by its
/// addresses (an exact lookup, not a dump). `Ok(None)`: the socket is not
/// a live one of a process; `Err`: no such socket, or sock_diag could not
/// answer here.
fn sock_diag_owner(client: SocketAddr, server: SocketAddr) -> std::io::Result<Option<u32>> {
    use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_REQUEST};
    use netlink_packet_sock_diag::constants::{AF_INET, AF_INET6, IPPROTO_TCP};
    use netlink_packet_sock_diag::inet::{ExtensionFlags, InetRequest, SocketId, StateFlags};
    use netlink_packet_sock_diag::SockDiagMessage;
    use netlink_sys::{protocols::NETLINK_SOCK_DIAG, Socket};

    let invalid = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
    let socket = Socket::new(NETLINK_SOCK_DIAG)?;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST;
    let request = InetRequest {
        family: if client.is_ipv4() { AF_INET } else { AF_INET6 },
        protocol: IPPROTO_TCP,
        extensions: ExtensionFlags::empty(),
        states: StateFlags::all(),
        socket_id: SocketId {
            source_port: client.port(),
            destination_port: server.port(),
            source_address: client.ip(),
            destination_address: server.ip(),
            interface_id: 0,
            // INET_DIAG_NOCOOKIE: match by addresses alone.
            cookie: [0xff; 8],
        },
    };
    let mut message = NetlinkMessage::new(header, SockDiagMessage::InetRequest(request).into());
    message.finalize();
    let mut sent = vec![0; message.buffer_len()];
    message.serialize(&mut sent);
    socket.send_to(&sent, &netlink_sys::SocketAddr::new(0, 0), 0)?;
    let mut received = Vec::with_capacity(1024);
    socket.recv(&mut received, 0)?;
    let reply = NetlinkMessage::<SockDiagMessage>::deserialize(&received).map_err(|err| invalid(err.to_string()))?;
    match reply.payload {
        // Only a live socket (ESTABLISHED) held by a process has an owner:
        // the kernel gives uid 0 for TIME_WAIT and orphaned ones.
        NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(response)) => {
            let header = response.header;
            Ok((header.state == TCP_ESTABLISHED && header.inode != 0).then_some(header.uid))
        }
        // ENOENT is also what a kernel without inet_diag answers: then
        // (or for a socket already gone) `/proc` decides.
        NetlinkPayload::Error(error) => Err(error.to_io()),
        other => Err(invalid(format!("unexpected sock_diag reply {other:?}"))),
    }
}

const TCP_ESTABLISHED: u8 = 1;

/// The same answer from `/proc/net/tcp{,6}`, read whole.
fn proc_table_owner(client: SocketAddr, server: SocketAddr) -> Option<u32> {
    let table = if client.is_ipv4() {
        "/proc/net/tcp"
    } else {
        "/proc/net/tcp6"
    };
    let text = std::fs::read_to_string(table).ok()?;
    find_owner(&text, client, server)
}

/// Reads a `/proc/net/tcp{,6}` table: the uid of the socket whose local
/// address is `local` and whose remote address is `remote`.
pub fn find_owner(table: &str, local: SocketAddr, remote: SocketAddr) -> Option<u32> {
    table.lines().skip(1).find_map(|line| {
        let mut fields = line.split_whitespace();
        let _slot = fields.next()?;
        let line_local = parse_address(fields.next()?)?;
        let line_remote = parse_address(fields.next()?)?;
        let state = fields.next()?;
        // Only a live socket (ESTABLISHED, "01") has an owner: the kernel
        // prints uid 0 for TIME_WAIT and orphaned rows.
        if line_local != local || line_remote != remote || state != "01" {
            return None;
        }
        // tx:rx queues, tr:when, retrnsmt, then uid; the inode after the
        // timeout (0 for a socket no process holds).
        let uid = fields.nth(3)?.parse().ok()?;
        let inode = fields.nth(1)?;
        (inode != "0").then_some(uid)
    })
}

/// `0100007F:C800` (IPv4) or 32 hex digits and a port (IPv6): the address
/// as the kernel prints it, 32-bit words in host (little-endian) order.
fn parse_address(text: &str) -> Option<SocketAddr> {
    let (ip_hex, port_hex) = text.split_once(':')?;
    let port = u16::from_str_radix(port_hex, 16).ok()?;
    let words: Vec<u32> = (0..ip_hex.len() / 8)
        .map(|word_idx| u32::from_str_radix(ip_hex.get(word_idx * 8..word_idx * 8 + 8)?, 16).ok())
        .collect::<Option<_>>()?;
    let ip = match words.as_slice() {
        [word] if ip_hex.len() == 8 => IpAddr::V4(Ipv4Addr::from(word.to_le_bytes())),
        [a, b, c, d] if ip_hex.len() == 32 => {
            let mut octets = [0u8; 16];
            for (word_idx, word) in [a, b, c, d].into_iter().enumerate() {
                octets[word_idx * 4..word_idx * 4 + 4].copy_from_slice(&word.to_le_bytes());
            }
            IpAddr::V6(Ipv6Addr::from(octets))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

impl tonic::transport::server::Connected for PlainTcp {
    type ConnectInfo = PlainTcpInfo;

    fn connect_info(&self) -> PlainTcpInfo {
        self.info
    }
}

impl AsyncRead for PlainTcp {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for PlainTcp {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1461 1 0 100 0 0 10 0
   1: 0100007F:C800 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1000        0 2211 1 0 20 4 30 10 -1
   2: 0100007F:1F90 0100007F:C800 01 00000000:00000000 00:00000000 00000000     0        0 2212 1 0 20 4 30 10 -1
";

    #[test]
    fn the_client_socket_names_its_owner() {
        let client: SocketAddr = "127.0.0.1:51200".parse().unwrap();
        let server: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        assert_eq!(find_owner(TCP, client, server), Some(1000));
        assert_eq!(find_owner(TCP, server, client), Some(0), "the server's own end");
        assert_eq!(find_owner(TCP, "127.0.0.1:1".parse().unwrap(), server), None);
    }

    #[test]
    fn ipv6_addresses_are_read_word_by_word() {
        let line = "0: 00000000000000000000000001000000:1F90 00000000000000000000000001000000:C800 01 0:0 0:0 0 42 0 9";
        let table = format!("header\n{line}\n");
        let server: SocketAddr = "[::1]:8080".parse().unwrap();
        let client: SocketAddr = "[::1]:51200".parse().unwrap();
        assert_eq!(find_owner(&table, server, client), Some(42));
    }

    #[test]
    fn a_real_loopback_connection_is_owned_by_this_process() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let server = listener.local_addr().unwrap();
        let client = std::net::TcpStream::connect(server).unwrap();
        let client_addr = client.local_addr().unwrap();
        let me = Some(nix::unistd::geteuid().as_raw());
        assert_eq!(sock_diag_owner(client_addr, server).unwrap(), me);
        assert_eq!(proc_table_owner(client_addr, server), me);
        assert_eq!(socket_owner(client_addr, server), me);
        let (accepted, _) = listener.accept().unwrap();
        drop(client);
        drop(accepted);
        assert_eq!(socket_owner(client_addr, server), None, "a closed socket has no owner");
        let unknown: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert!(sock_diag_owner(unknown, server).is_err(), "no such socket");
        assert_eq!(socket_owner(unknown, server), None);
    }

    proptest! {
        #[test]
        fn no_table_text_makes_it_panic(text in "\\PC{0,400}") {
            let _ = find_owner(&text, "127.0.0.1:1".parse().unwrap(), "127.0.0.1:2".parse().unwrap());
        }
    }
}
