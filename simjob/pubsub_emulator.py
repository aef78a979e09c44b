"""The official Pub/Sub emulator on a free loopback port, for integration tests.

``PubSubEmulator`` starts the emulator that ships in the Debian package
``google-cloud-cli-pubsub-emulator`` (FACTS section 8), waits until it answers
HTTP on its port, and on exit kills its whole process group (the launcher is a
shell script that starts java; the gcloud wrapper adds a Python process).
A missing emulator or java raises :class:`EmulatorMissing` naming what is
missing and how to install it: tests that need the emulator fail, never skip.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any
from unittest import mock

from simjob.ports import free_port

INSTALL_HINT = (
    "install it with `sudo apt-get install google-cloud-cli-pubsub-emulator openjdk-17-jre-headless` "
    "(Google Cloud SDK apt repository), or `gcloud components install pubsub-emulator` for a "
    "non-Debian SDK install"
)
LAUNCHER = Path("platform/pubsub-emulator/bin/cloud-pubsub-emulator")


class EmulatorMissing(RuntimeError):
    """The Pub/Sub emulator (or what it needs) is not installed here."""


class EmulatorFailed(RuntimeError):
    """The emulator was found but did not start or answer."""


@contextlib.contextmanager
def emulator_env(host: str) -> Iterator[None]:
    """PUBSUB_EMULATOR_HOST set to ``host`` while a client is built (clients read it only then)."""
    with mock.patch.dict(os.environ, {"PUBSUB_EMULATOR_HOST": host}):
        yield


class PubSubEmulator:
    """One emulator process; use as a context manager or call start()/stop()."""

    def __init__(self, project: str = "elastic-sidecar-test", *, startup_timeout: float = 60.0) -> None:
        self.project = project
        self.startup_timeout = startup_timeout
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._scratch: tempfile.TemporaryDirectory[str] | None = None
        self._log_path: Path | None = None

    @property
    def host(self) -> str:
        if not self.port:
            raise RuntimeError("emulator not started")
        return f"127.0.0.1:{self.port}"

    # -- finding and starting ---------------------------------------------------

    def _command(self, scratch: Path) -> tuple[list[str], dict[str, str]]:
        env = {
            **os.environ,
            "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
            "CLOUDSDK_CONFIG": str(scratch / "gcloud-config"),
        }
        env.pop("PUBSUB_EMULATOR_HOST", None)
        if shutil.which("java", path=env.get("PATH")) is None:
            raise EmulatorMissing(
                "java is not on PATH: the Pub/Sub emulator needs a Java 11+ runtime; "
                "install it with `sudo apt-get install openjdk-17-jre-headless`"
            )
        gcloud = shutil.which("gcloud", path=env.get("PATH"))
        if gcloud is None:
            raise EmulatorMissing(f"gcloud is not on PATH, so the Pub/Sub emulator cannot be found; {INSTALL_HINT}")
        try:
            out = subprocess.run(
                [gcloud, "info", "--format=value(installation.sdk_root)"],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            )
            sdk_root = Path(out.stdout.strip())
        except (subprocess.SubprocessError, OSError) as e:
            raise EmulatorFailed(f"`gcloud info` failed, cannot find the SDK root: {e}") from e
        launcher = sdk_root / LAUNCHER
        if launcher.is_file() and os.access(launcher, os.X_OK):
            return [str(launcher), "--host=127.0.0.1"], env
        raise EmulatorMissing(
            f"the Pub/Sub emulator is not installed: {launcher} does not exist "
            f"(gcloud SDK root {sdk_root}); {INSTALL_HINT}"
        )

    def start(self) -> PubSubEmulator:
        if self._proc is not None:
            raise RuntimeError(f"emulator already running on {self.host}")
        self._scratch = tempfile.TemporaryDirectory(prefix="pubsub-emulator-")
        scratch = Path(self._scratch.name)
        try:
            cmd_env = self._command(scratch)
            last: Exception | None = None
            for _attempt in range(3):  # a free port can be taken between probe and bind
                last = self._try_start(scratch, *cmd_env)
                if last is None:
                    return self
            raise last or EmulatorFailed("emulator did not start")
        except BaseException:
            self.stop()
            raise

    def _try_start(self, scratch: Path, cmd: list[str], env: dict[str, str]) -> EmulatorFailed | None:
        self.port = free_port()
        cmd = [*cmd, f"--port={self.port}"]
        self._log_path = scratch / f"emulator-{self.port}.log"
        with open(self._log_path, "wb") as out:
            self._proc = subprocess.Popen(
                cmd, env=env, cwd=scratch, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            self._wait_ready()
            return None
        except EmulatorFailed as e:
            self._kill()
            return e

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise EmulatorFailed(f"emulator exited with {self._proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"http://{self.host}/", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise EmulatorFailed(
            f"emulator did not answer on {self.host} within {self.startup_timeout} s:\n{self.log_tail()}"
        )

    def log_tail(self, n: int = 40) -> str:
        if self._log_path is None or not self._log_path.exists():
            return "(no log)"
        return "\n".join(self._log_path.read_text(errors="replace").splitlines()[-n:])

    # -- stopping ---------------------------------------------------------------

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
                # the group may outlive its leader (java started by the launcher script)
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
            time.sleep(0.2)

    def stop(self) -> None:
        self._kill()
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None

    def __enter__(self) -> PubSubEmulator:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- clients and helpers ----------------------------------------------------

    def publisher_client(self, **kw: Any) -> Any:
        """A PublisherClient bound to this emulator (``kw`` e.g. ``batch_settings=``)."""
        from google.cloud import pubsub_v1

        with emulator_env(self.host):
            return pubsub_v1.PublisherClient(**kw)

    def subscriber_client(self, **kw: Any) -> Any:
        from google.cloud import pubsub_v1

        with emulator_env(self.host):
            return pubsub_v1.SubscriberClient(**kw)

    def create_topic_and_subscription(
        self, project: str, topic: str, sub: str, *, ack_deadline_seconds: int = 10
    ) -> tuple[str, str]:
        """Create ``topic`` and a pull subscription ``sub`` on it; returns their full paths."""
        pub = self.publisher_client()
        subscriber = self.subscriber_client()
        try:
            topic_path = pub.topic_path(project, topic)
            sub_path = subscriber.subscription_path(project, sub)
            pub.create_topic(name=topic_path)
            subscriber.create_subscription(name=sub_path, topic=topic_path, ack_deadline_seconds=ack_deadline_seconds)
            return topic_path, sub_path
        finally:
            subscriber.close()
            pub.transport.close()


def publish_all(
    publisher: Any, topic_path: str, messages: Iterable[tuple[bytes, dict[str, str]]], timeout: float = 120.0
) -> Sequence[str]:
    """Publish every (data, attributes) and wait for all; returns the message ids in order."""
    futures = [publisher.publish(topic_path, data, **attrs) for data, attrs in messages]
    return [f.result(timeout=timeout) for f in futures]
