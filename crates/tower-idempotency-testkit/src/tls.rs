//! Certificates for the tests' TLS servers: a CA of the test's own and a server certificate it
//! signed for 127.0.0.1, written to PEM files a server process reads.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};

/// A fresh CA and a server certificate it signed for `127.0.0.1` and `localhost`, as PEM.
pub struct TestCertificates {
    /// The CA's certificate: what a client trusts.
    pub ca_pem: String,
    /// The server's certificate.
    pub cert_pem: String,
    /// The server's private key.
    pub key_pem: String,
}

/// The PEM files [`TestCertificates::write`] made.
pub struct CertificateFiles {
    /// The CA's certificate.
    pub ca: PathBuf,
    /// The server's certificate.
    pub cert: PathBuf,
    /// The server's private key (readable by its owner only, as Postgres requires).
    pub key: PathBuf,
}

impl TestCertificates {
    /// Makes a CA and a server certificate signed by it.
    ///
    /// # Panics
    ///
    /// When rcgen cannot make them (it always can with its default features).
    pub fn generate() -> Self {
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "tower-idempotency test CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("CA key"))
            .expect("CA certificate");
        // rcgen makes an IP address entry of a name that parses as one.
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
                .expect("server parameters");
        params
            .distinguished_name
            .push(DnType::CommonName, "127.0.0.1");
        let key = KeyPair::generate().expect("server key");
        let cert = params.signed_by(&key, &ca).expect("server certificate");
        Self {
            ca_pem: ca.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    /// Writes the CA certificate, the server certificate and its key to `ca.pem`, `cert.pem`
    /// and `key.pem` in `dir` (the key with mode 0600).
    pub fn write(&self, dir: &Path) -> std::io::Result<CertificateFiles> {
        use std::os::unix::fs::PermissionsExt;
        let files = CertificateFiles {
            ca: dir.join("ca.pem"),
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
        };
        std::fs::write(&files.ca, &self.ca_pem)?;
        std::fs::write(&files.cert, &self.cert_pem)?;
        std::fs::write(&files.key, &self.key_pem)?;
        std::fs::set_permissions(&files.key, std::fs::Permissions::from_mode(0o600))?;
        Ok(files)
    }
}
