//! Certificates and keys for one control plane: a CA, the API server's serving certificate, an admin client
//! certificate (group `system:masters`, as envtest does) and the service-account signing key.

use std::net::{IpAddr, Ipv4Addr};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

use crate::Error;

/// PEM material written into the control plane's directory.
pub struct Pki {
    pub ca_cert: String,
    /// The CA's key, kept so a real node can get a client certificate signed later ([`node_client_cert`]).
    pub ca_key: String,
    pub serving_cert: String,
    pub serving_key: String,
    pub admin_cert: String,
    pub admin_key: String,
    pub service_account_key: String,
    pub service_account_public_key: String,
}

impl Pki {
    pub fn generate() -> Result<Self, Error> {
        Self::try_generate().map_err(Error::GenerateCertificates)
    }

    fn try_generate() -> Result<Self, rcgen::Error> {
        let ca_key = KeyPair::generate()?;
        let ca_key_pem = ca_key.serialize_pem();
        let ca_params = ca_params()?;
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca_params, ca_key);

        let serving_key = KeyPair::generate()?;
        let mut serving = CertificateParams::new(vec![
            "localhost".to_owned(),
            "kubernetes".to_owned(),
            "kubernetes.default".to_owned(),
            "kubernetes.default.svc".to_owned(),
        ])?;
        serving
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        serving.distinguished_name = name("kube-apiserver", None);
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving_cert = serving.signed_by(&serving_key, &issuer)?;

        let admin_key = KeyPair::generate()?;
        let mut admin = CertificateParams::new(Vec::<String>::new())?;
        admin.distinguished_name = name("arc-rs-admin", Some("system:masters"));
        admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let admin_cert = admin.signed_by(&admin_key, &issuer)?;

        let service_account_key = KeyPair::generate()?;

        Ok(Self {
            ca_cert: ca_cert.pem(),
            ca_key: ca_key_pem,
            serving_cert: serving_cert.pem(),
            serving_key: serving_key.serialize_pem(),
            admin_cert: admin_cert.pem(),
            admin_key: admin_key.serialize_pem(),
            service_account_key: service_account_key.serialize_pem(),
            service_account_public_key: service_account_key.public_key_pem(),
        })
    }
}

/// The CA's parameters. Signing needs only its name and key, so an issuer rebuilt from these and the saved
/// key signs certificates that chain to the CA certificate written at start.
fn ca_params() -> Result<CertificateParams, rcgen::Error> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.distinguished_name = name("arc-rs test control plane CA", None);
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(ca_params)
}

/// A kubelet's client certificate and key (PEM): user `system:node:<node>`, group `system:nodes`, as the
/// kubelet's TLS bootstrap would obtain, signed by the control plane's CA (`ca_key_pem`).
pub fn node_client_cert(ca_key_pem: &str, node: &str) -> Result<(String, String), Error> {
    let sign = || -> Result<(String, String), rcgen::Error> {
        let issuer = Issuer::new(ca_params()?, KeyPair::from_pem(ca_key_pem)?);
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name = name(&format!("system:node:{node}"), Some("system:nodes"));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    };
    sign().map_err(Error::GenerateCertificates)
}

fn name(common_name: &str, organization: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    if let Some(org) = organization {
        dn.push(DnType::OrganizationName, org);
    }
    dn
}
