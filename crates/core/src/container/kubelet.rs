//! The kubelet's pod-resources API (`k8s.io/kubelet/pkg/apis/podresources/v1`, the one
//! dcgm-exporter reads): `List` over the kubelet's unix socket, bounded in time.
//!
//! It is the one source that says which devices each container was allocated
//! (`nvidia.com/gpu` device ids are GPU UUIDs), and it names every pod the kubelet
//! runs. It gives no pod UID: `container::sources` joins it with the node's files.
//! A real gRPC client (tonic over HTTP/2, on a current-thread tokio runtime made
//! for the call and dropped after it): the kubelet speaks nothing else on that socket.
//! It is built with the `kubelet` feature (on by default: docs/install.md says what it
//! costs); a build without it says so where the socket is there to be asked.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

#[cfg(feature = "kubelet")]
use client::ask;

/// A `List` answer larger than this is refused (the kubelet's own limit is 16 MiB).
#[cfg(feature = "kubelet")]
const MAX_ANSWER: usize = 16 << 20;

/// One pod as the kubelet lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pod {
    pub namespace: String,
    pub name: String,
    pub containers: Vec<Container>,
}

/// One container of a pod and what it was allocated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container {
    pub name: String,
    /// Device ids of its GPU resources (`nvidia.com/gpu` and other `*/gpu`
    /// names), a shared GPU's replica suffix (`GPU-…::1`) cut off.
    pub gpus: BTreeSet<String>,
    /// It was also given devices whose ids are not GPU UUIDs (MIG slices
    /// `nvidia.com/mig-*`, dynamic resource allocation claims): what GPUs it
    /// may use cannot then be told from this list.
    pub opaque: bool,
}

/// Why the kubelet gave no list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Nothing at the socket's path.
    Absent,
    /// No answer within the limit.
    TimedOut(Duration),
    /// Connected, but no valid answer (not gRPC, an error status, garbage).
    Failed(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Absent => write!(f, "no socket there"),
            Failure::TimedOut(limit) => {
                write!(f, "no answer within {:.1} s", limit.as_secs_f64())
            }
            Failure::Failed(why) => write!(f, "{why}"),
        }
    }
}

/// `List` on the socket at `socket`, within `limit` (connection included).
pub fn list(socket: &Path, limit: Duration) -> Result<Vec<Pod>, Failure> {
    if std::fs::symlink_metadata(socket).is_err() {
        return Err(Failure::Absent);
    }
    ask_within(socket, limit)
}

#[cfg(feature = "kubelet")]
fn ask_within(socket: &Path, limit: Duration) -> Result<Vec<Pod>, Failure> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(|error| Failure::Failed(format!("cannot start the client: {error}")))?;
    let socket = socket.to_path_buf();
    runtime.block_on(async move {
        match tokio::time::timeout(limit, ask(socket)).await {
            Ok(answer) => answer,
            Err(_) => Err(Failure::TimedOut(limit)),
        }
    })
}

/// Without the gRPC client (`--no-default-features`): a socket that is there
/// is one this build cannot ask, said in words; the node's files still name
/// the pods.
#[cfg(not(feature = "kubelet"))]
fn ask_within(_socket: &Path, _limit: Duration) -> Result<Vec<Pod>, Failure> {
    Err(Failure::Failed(
        "this gpureap was built without the kubelet client (cargo feature \"kubelet\")".to_string(),
    ))
}

#[cfg(feature = "kubelet")]
mod client {
    use std::path::PathBuf;

    use hyper_util::rt::TokioIo;
    use tonic::transport::{Endpoint, Uri};

    use super::super::pod_resources::ListPodResourcesRequest;
    use super::super::pod_resources::pod_resources_lister_client::PodResourcesListerClient;
    use super::{Container, Failure, MAX_ANSWER, Pod, gpu_of_device, is_gpu_resource};

    pub(super) async fn ask(socket: PathBuf) -> Result<Vec<Pod>, Failure> {
        // The URI is required by HTTP/2 but unused: the connector below dials the socket.
        let endpoint = Endpoint::from_static("http://kubelet.sock");
        let connector = tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(socket).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        });
        let channel = endpoint
            .connect_with_connector(connector)
            .await
            .map_err(|error| Failure::Failed(format!("cannot connect: {}", chain(&error))))?;
        let mut client =
            PodResourcesListerClient::new(channel).max_decoding_message_size(MAX_ANSWER);
        let answer = client
            .list(ListPodResourcesRequest {})
            .await
            .map_err(|status| {
                Failure::Failed(format!(
                    "List failed: {} ({})",
                    status.message(),
                    status.code().description()
                ))
            })?;
        Ok(answer
            .into_inner()
            .pod_resources
            .into_iter()
            .map(|pod| Pod {
                namespace: pod.namespace,
                name: pod.name,
                containers: pod
                    .containers
                    .into_iter()
                    .map(|container| Container {
                        name: container.name,
                        gpus: container
                            .devices
                            .iter()
                            .filter(|devices| is_gpu_resource(&devices.resource_name))
                            .flat_map(|devices| devices.device_ids.iter())
                            .map(|id| gpu_of_device(id).to_string())
                            .collect(),
                        opaque: !container.dynamic_resources.is_empty()
                            || container.devices.iter().any(|devices| {
                                devices.resource_name.starts_with("nvidia.com/")
                                    && !is_gpu_resource(&devices.resource_name)
                            }),
                    })
                    .collect(),
            })
            .collect())
    }

    /// An error and its causes on one line (hyper's and h2's say little alone).
    fn chain(error: &dyn std::error::Error) -> String {
        let mut text = error.to_string();
        let mut source = error.source();
        while let Some(cause) = source {
            text.push_str(": ");
            text.push_str(&cause.to_string());
            source = cause.source();
        }
        text
    }
}

/// A device plugin's resource of whole or shared GPUs: `nvidia.com/gpu`, and
/// the renamed resources of time-slicing setups (`nvidia.com/gpu.shared`).
#[cfg(feature = "kubelet")]
pub(crate) fn is_gpu_resource(name: &str) -> bool {
    name.starts_with("nvidia.com/gpu")
}

/// The GPU a device id names: a time-sliced replica `GPU-uuid::3` is GPU-uuid.
#[cfg(feature = "kubelet")]
pub(crate) fn gpu_of_device(id: &str) -> &str {
    id.split("::").next().unwrap_or(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "kubelet")]
    #[test]
    fn replicas_name_their_gpu() {
        assert_eq!(gpu_of_device("GPU-1234::2"), "GPU-1234");
        assert_eq!(gpu_of_device("GPU-1234"), "GPU-1234");
        assert_eq!(gpu_of_device(""), "");
    }

    #[cfg(feature = "kubelet")]
    #[test]
    fn gpu_resources_by_name() {
        assert!(is_gpu_resource("nvidia.com/gpu"));
        assert!(is_gpu_resource("nvidia.com/gpu.shared"));
        assert!(!is_gpu_resource("example.com/fpga"));
    }

    #[test]
    fn absent_socket_is_absent() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("kubelet.sock");
        assert_eq!(list(&missing, Duration::from_secs(1)), Err(Failure::Absent));
    }
}
