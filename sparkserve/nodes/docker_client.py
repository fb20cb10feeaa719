"""A docker SDK client that talks to a node's dockerd over that node's own SSH connection.

docker-py's paramiko transport runs ``docker system dial-stdio`` on the node for each pooled connection,
but on its own terms: it reads ``~/.ssh/config`` and ``~/.ssh/known_hosts``, lets paramiko try default
keys and the agent, and keys connection pools by request URL — so every new endpoint opens another SSH
channel and sshd's ``MaxSessions`` (10) runs out after about ten distinct calls (rig-notes.md section 5).

:class:`NodeSSHAdapter` fixes all three: it borrows the node's paramiko client (explicit key, the
configured known_hosts, ``RejectPolicy``) through the small :class:`SSHEndpoint` protocol that
:class:`~sparkserve.nodes.ssh.SSHNode` satisfies, maps every URL to ONE pool of at most :data:`POOL_SIZE`
channels, and opens those channels with a window sized for paramiko (see :data:`WINDOW`).

    client = docker_over_ssh(node)       # what SSHNode.docker() returns (cached there)
    client.images.get("sparkserve-testbase:bookworm").id

For a LocalNode use :func:`docker_local` (``DOCKER_HOST`` or the default socket).

This subclasses private parts of docker-py (``_create_paramiko_client``, ``SSHConnection``,
``_custom_adapter``, ``_version``, ``_check_is_tty``): pyproject pins ``docker>=7.1,<8`` and
tests/rig/test_nodes_docker.py checks it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Protocol

import docker
import docker.errors
import paramiko
import requests
from docker.transport.sshconn import SSHConnection, SSHConnectionPool, SSHHTTPAdapter

from sparkserve.nodes.base import Node, NodeError

POOL_KEY = "http+docker://ssh/"
POOL_SIZE = 2  # channels kept open per node (a `logs --follow` stream holds one while others run)
# Receive window of the dial-stdio channel. Small on purpose: paramiko's BufferedPipe deletes from the front
# of one array on every read, so a backlog of W bytes costs O(W) per 8-32 KB read; with a 64 MiB window an
# image stream (`docker save` while `docker load` is being fed) ran at 4 MB/s, with 1 MiB at ~38 MB/s.
WINDOW = 2**20
API_TIMEOUT_S = 120
MIN_API = "1.41"  # docker 20.10 (the rig, and older DGX OS images)


class SSHEndpoint(Node, Protocol):
    """A node reached over SSH, as the adapter needs it: where it is and its live paramiko client (and
    ``run``, to ask the node's docker CLI why the API did not answer)."""

    user: str
    host: str
    port: int

    def ssh_client(self) -> paramiko.SSHClient:
        """The node's connected paramiko client (reconnecting if the link dropped)."""
        ...


class _WideConnection(SSHConnection):
    """``docker system dial-stdio`` on a session channel with a bounded receive window."""

    def connect(self) -> None:
        sock = self.ssh_transport.open_session(window_size=WINDOW)
        sock.settimeout(self.timeout)
        sock.exec_command("docker system dial-stdio")
        self.sock = sock


class _WidePool(SSHConnectionPool):
    def _new_conn(self) -> _WideConnection:
        return _WideConnection(self.ssh_transport, self.timeout, self.ssh_host)

    def _get_conn(self, timeout: float | None) -> Any:
        # docker-py's override skips urllib3's dropped-connection check: a pooled channel whose
        # dial-stdio ended (dockerd restarted) would fail the next request once
        conn = super()._get_conn(timeout)
        chan = getattr(conn, "sock", None)
        if chan is not None and (getattr(chan, "closed", False) or getattr(chan, "eof_received", False)):
            conn.close()
            return self._new_conn()
        return conn


class NodeSSHAdapter(SSHHTTPAdapter):
    """docker-py's SSH adapter on an existing node connection, every request in one pool."""

    def __init__(
        self, node: SSHEndpoint, *, timeout: int = API_TIMEOUT_S, max_pool_size: int = POOL_SIZE
    ) -> None:
        self._node = node
        super().__init__(f"ssh://{node.user}@{node.host}:{node.port}", timeout=timeout,
                         pool_connections=1, max_pool_size=max_pool_size)

    def _create_paramiko_client(self, base_url: str) -> None:
        self.ssh_client = self._node.ssh_client()
        self.ssh_params: dict[str, Any] = {}

    def _connect(self) -> None:
        """Nothing to do: the node owns its SSH connection and reconnects it."""

    def get_connection(self, url: str, proxies: Any = None) -> SSHConnectionPool:
        client = self._node.ssh_client()  # reconnects if the link dropped
        with self.pools.lock:
            if client is not self.ssh_client:
                self.pools.clear()  # pools hold channels of the dead transport
                self.ssh_client = client
            pool = self.pools.get(POOL_KEY)
            if pool is None:
                pool = _WidePool(ssh_client=client, timeout=self.timeout, maxsize=self.max_pool_size,
                                 host=self.ssh_host)
                self.pools[POOL_KEY] = pool
            return pool

    def close(self) -> None:
        # close the pooled channels but never the node's SSH connection
        with self.pools.lock:
            self.pools.clear()


class NodeAPIClient(docker.APIClient):
    """docker-py's API client, remembering each container's ``Tty`` (fixed at create) from the inspects it
    makes: docker-py inspects a container before every log read to learn it, and the readiness wait reads
    every rank's log several times a second, right after inspecting it for its state."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tty: dict[str, bool] = {}

    def inspect_container(self, container: Any) -> dict[str, Any]:
        attrs = dict(super().inspect_container(container))
        cid = attrs.get("Id")
        if isinstance(cid, str):
            self._tty[cid] = bool((attrs.get("Config") or {}).get("Tty"))
        return attrs

    def _check_is_tty(self, container: Any) -> bool:
        known = self._tty.get(container) if isinstance(container, str) else None
        return known if known is not None else bool(super()._check_is_tty(container))


class NodeDockerClient(docker.DockerClient):
    """A DockerClient whose first ``version()`` is the answer the connection was opened with (docker-py
    asks the daemon's version to connect; `doctor` and `up` ask it right after, as their docker check):
    one round trip, not two. Every later call asks the daemon."""

    _opened_with: dict[str, Any] | None = None

    def version(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        first, self._opened_with = self._opened_with, None
        if first is not None and not args and not kwargs:
            return first
        return dict(self.api.version(*args, **kwargs))


def _client_with_adapter(adapter: Any, timeout: int) -> NodeDockerClient:
    # a unix base URL makes the constructor do no I/O; the SSH adapter replaces its adapter below
    api = NodeAPIClient(base_url="unix:///nonexistent/docker.sock", version=MIN_API, timeout=timeout)
    old = api.adapters.pop("http+docker://", None)
    if old is not None:
        old.close()
    api.mount("http+docker://ssh", adapter)
    api.base_url = "http+docker://ssh"
    api._custom_adapter = adapter
    # no proxy, netrc or CA bundle applies to a channel of the node's own SSH connection; requests would
    # otherwise read them from the environment (and ~/.netrc) on every call, a few hundred a run
    api.trust_env = False
    info = _server_version(api)
    api._version = info["ApiVersion"]
    client = NodeDockerClient.__new__(NodeDockerClient)
    client.api = api
    client._opened_with = info
    return client


def _server_version(api: NodeAPIClient) -> dict[str, Any]:
    """docker-py's ``_retrieve_server_version``, keeping the whole answer (same errors)."""
    try:
        info = dict(api.version(api_version=False))
    except Exception as e:  # noqa: BLE001 - docker-py's own wording for any failure here
        raise docker.errors.DockerException(f"Error while fetching server API version: {e}") from e
    if "ApiVersion" not in info:
        raise docker.errors.DockerException('Invalid response from docker daemon: key "ApiVersion" is missing.')
    return info


def docker_over_ssh(node: SSHEndpoint, *, timeout: int = API_TIMEOUT_S) -> NodeDockerClient:
    """A DockerClient for ``node``'s dockerd over its SSH connection. Raises NodeError if docker is down."""
    adapter = NodeSSHAdapter(node, timeout=timeout)
    try:
        return _client_with_adapter(adapter, timeout)
    except (docker.errors.DockerException, paramiko.SSHException, OSError) as e:
        adapter.close()
        raise docker_unreachable(node, e) from None


@contextlib.contextmanager
def docker_errors(node: Node, step: str, what: str = "") -> Iterator[None]:
    """Turn whatever the docker SDK raises inside the block into a NodeError naming the node and step."""
    try:
        yield
    except NodeError:
        raise
    except docker.errors.APIError as e:
        msg = e.explanation or str(e)
        if isinstance(msg, bytes):
            msg = msg.decode(errors="replace")
        raise NodeError(node.name, step, f"{what + ': ' if what else ''}{msg}") from None
    except docker.errors.DockerException as e:
        raise NodeError(node.name, step, f"{what + ': ' if what else ''}{e}") from None
    except (requests.exceptions.RequestException, paramiko.SSHException, OSError, EOFError) as e:
        raise docker_unreachable(node, e, step=step) from None


def docker_unreachable(node: Node, e: BaseException, *, step: str = "docker") -> NodeError:
    """Ask the docker CLI on the node why the API did not answer; its message is the useful one."""
    why = ""
    try:
        res = node.run(["docker", "version", "--format", "{{.Server.Version}}"], timeout=20, check=False,
                       step="docker")
        if res.exit_code == 127:
            why = "no docker CLI on the node (the SDK runs `docker system dial-stdio` there)"
        elif not res.ok:
            why = (res.stderr.strip().splitlines() or [f"docker version exited {res.exit_code}"])[-1]
    except NodeError as ne:
        why = ne.what
    if not why:  # the daemon answers the CLI: the API connection itself broke
        return NodeError(node.name, step, f"lost the docker connection: {type(e).__name__}: {e}")
    return NodeError(node.name, step, f"dockerd not reachable: {why}")


def docker_local(
    name: str, base_url: str | None = None, *, timeout: int = API_TIMEOUT_S
) -> docker.DockerClient:
    """A DockerClient for this machine's daemon: ``base_url``, else ``DOCKER_HOST``, else the socket."""
    try:
        if base_url:
            return docker.DockerClient(base_url=base_url, version="auto", timeout=timeout)
        return docker.from_env(version="auto", timeout=timeout)
    except docker.errors.DockerException as e:
        raise NodeError(name, "docker", f"dockerd not reachable: {e}") from None


class LogStream:
    """A container's log lines from one streaming docker response (an iterator), which ANY thread may
    :meth:`cancel`: the way a followed log is stopped before the container ends. docker-py's own
    ``close()`` refuses streams over SSH; closing the stream's SSH channel ends it for the reader (who
    sees the end of the log) and for dockerd."""

    def __init__(self, stream: Any, lines: Iterator[str]) -> None:
        self._stream = stream
        self._lines = lines

    def __iter__(self) -> LogStream:
        return self

    def __next__(self) -> str:
        return next(self._lines)

    def cancel(self) -> None:
        with contextlib.suppress(Exception):  # already ended: nothing to stop
            fp = self._stream._response.raw._fp.fp
            channel = getattr(fp, "channel", None)
            if channel is not None:
                channel.close()
            else:
                self._stream.close()  # a unix or TCP socket (LocalNode): docker-py's own way
