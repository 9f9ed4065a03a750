//! Serving axum over TLS: a CA and a serving certificate generated per fake, and an axum listener whose
//! connections are TLS streams (handshakes run in their own tasks so a stalled client blocks nobody).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::{Error, LOGIN_HOST, VAULT_HOST};

/// The CA certificate (PEM) and the acceptor serving a certificate it signed.
pub fn generate() -> Result<(String, TlsAcceptor), Error> {
    let ca_key = KeyPair::generate().map_err(Error::GenerateCertificates)?;
    let mut ca_params =
        CertificateParams::new(Vec::<String>::new()).map_err(Error::GenerateCertificates)?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "fake-azure test CA");
    let ca_cert = ca_params
        .self_signed(&ca_key)
        .map_err(Error::GenerateCertificates)?;
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().map_err(Error::GenerateCertificates)?;
    let mut params = CertificateParams::new(vec![
        "localhost".to_owned(),
        LOGIN_HOST.to_owned(),
        VAULT_HOST.to_owned(),
    ])
    .map_err(Error::GenerateCertificates)?;
    params
        .subject_alt_names
        .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(Error::GenerateCertificates)?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(Error::ConfigureTls)?
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .map_err(Error::ConfigureTls)?;
    Ok((ca_cert.pem(), TlsAcceptor::from(Arc::new(config))))
}

/// An axum listener yielding TLS connections.
pub struct TlsListener {
    local: SocketAddr,
    connections: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
}

impl TlsListener {
    /// Accepts on `tcp` in a background task that ends when the listener is dropped.
    pub fn new(tcp: TcpListener, acceptor: TlsAcceptor) -> std::io::Result<Self> {
        let local = tcp.local_addr()?;
        let (sender, connections) = mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                let Ok((stream, peer)) = tcp.accept().await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                if sender.is_closed() {
                    return;
                }
                let acceptor = acceptor.clone();
                let sender = sender.clone();
                tokio::spawn(async move {
                    let handshake =
                        tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream));
                    if let Ok(Ok(tls)) = handshake.await {
                        let _ = sender.send((tls, peer)).await;
                    }
                });
            }
        });
        Ok(Self { local, connections })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.connections.recv().await {
            Some(connection) => connection,
            // The accept task only ends with the listener; never reached while serving.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
