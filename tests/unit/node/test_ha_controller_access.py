"""RequestControllerAccess: the brokers' way to the HA controller (the node's and the
simulator's): lanes, sequences kept across an unknown outcome, answers and their absence."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from quorumlog.codec import wire
from quorumlog.errors import UnavailableError
from quorumlog.ha.controller_model import (
    AlterSyncStateSet,
    BrokerGroupInfo,
    BrokerHeartbeat,
    GetGroup,
    HAControllerResult,
    RegisterBroker,
    decode_commands,
    encode_results,
)
from quorumlog.node.ha_controller_access import RequestControllerAccess
from quorumlog.node.peer_requests import Accept, MakeRequest
from quorumlog.runtime.completion import Completion
from quorumlog.testing.manual import ManualScheduler

GROUP = "group-a"
INFO = BrokerGroupInfo(GROUP, [], "b1", 1, ["b1"], 1)


@dataclass
class Sent:
    request: wire.HAControllerRequest
    completion: Completion[wire.Frame]

    @property
    def command(self) -> object:
        [command] = decode_commands(self.request.commands)
        return command

    def answer(self, result: HAControllerResult) -> None:
        self.completion.set_result(
            wire.HAControllerResponse(
                request_id=self.request.request_id, results=encode_results([result])
            )
        )


@dataclass
class FakeRequests:
    """`PeerRequests` whose requests the test answers (or lets time out) by hand."""

    scheduler: ManualScheduler
    sent: list[Sent] = field(default_factory=list)

    def request(
        self,
        addresses: Sequence[str],
        make_request: MakeRequest,
        accept: Accept | None = None,
        timeout_seconds: float = 5.0,
        attempt_timeout_seconds: float | None = None,
    ) -> Completion[wire.Frame]:
        request = make_request(len(self.sent) + 1)
        assert isinstance(request, wire.HAControllerRequest)
        completion: Completion[wire.Frame] = Completion(self.scheduler)
        self.sent.append(Sent(request, completion))
        return completion


def access() -> tuple[ManualScheduler, FakeRequests, RequestControllerAccess]:
    scheduler = ManualScheduler()
    requests = FakeRequests(scheduler)
    return scheduler, requests, RequestControllerAccess(requests, scheduler, ["n1:1"])


def test_a_heartbeat_never_waits_behind_a_write_and_writes_go_in_order() -> None:
    scheduler, requests, controller = access()
    answers: list[str] = []
    controller.submit(RegisterBroker(GROUP, "b1", "a:1"), lambda r: answers.append("register"))
    controller.submit(
        AlterSyncStateSet(GROUP, "b1", 1, 1, ["b1"]), lambda r: answers.append("alter")
    )
    controller.submit(BrokerHeartbeat(GROUP, "b1", 0, 1), lambda r: answers.append("heartbeat"))
    assert [type(sent.command).__name__ for sent in requests.sent] == [
        "RegisterBroker",
        "BrokerHeartbeat",
    ]  # the alter waits for the register; the heartbeat does not
    requests.sent[1].answer(HAControllerResult(ok=True, group=INFO))
    scheduler.run_until_idle()
    assert answers == ["heartbeat"]
    requests.sent[0].answer(HAControllerResult(ok=True, group=INFO))
    scheduler.run_until_idle()
    assert answers == ["heartbeat", "register"]
    assert isinstance(requests.sent[2].command, AlterSyncStateSet)


def test_a_write_repeated_after_an_unknown_outcome_keeps_its_sequence() -> None:
    scheduler, requests, controller = access()
    answers: list[HAControllerResult | None] = []
    register = RegisterBroker(GROUP, "b1", "a:1")
    controller.submit(register, answers.append)
    requests.sent[0].completion.set_exception(UnavailableError("no node answered"))
    scheduler.run_until_idle()
    assert answers == [None]  # unknown: the controller may have applied it
    controller.submit(register, answers.append)
    controller.submit(RegisterBroker(GROUP, "b1", "a:2"), answers.append)
    first, again = requests.sent[0].command, requests.sent[1].command
    assert isinstance(first, RegisterBroker) and isinstance(again, RegisterBroker)
    assert again.sequence == first.sequence  # the controller applies it once
    requests.sent[1].answer(HAControllerResult(ok=True, group=INFO))
    scheduler.run_until_idle()
    other = requests.sent[2].command
    assert isinstance(other, RegisterBroker) and other.sequence > first.sequence
    assert requests.sent[2].request.first_unacknowledged == other.sequence


def test_a_duplicate_without_its_answer_reads_the_group() -> None:
    scheduler, requests, controller = access()
    answers: list[HAControllerResult | None] = []
    controller.submit(RegisterBroker(GROUP, "b1", "a:1"), answers.append)
    requests.sent[0].answer(HAControllerResult(ok=True, group=None))
    scheduler.run_until_idle()
    assert isinstance(requests.sent[1].command, GetGroup) and answers == []
    requests.sent[1].answer(HAControllerResult(ok=True, group=INFO))
    scheduler.run_until_idle()
    assert answers == [HAControllerResult(ok=True, group=INFO)]


def test_a_malformed_answer_is_an_unknown_outcome_and_a_refusal_is_a_result() -> None:
    scheduler, requests, controller = access()
    answers: list[HAControllerResult | None] = []
    controller.submit(BrokerHeartbeat(GROUP, "b1", 0, 1), answers.append)
    requests.sent[0].completion.set_result(wire.HAControllerResponse(request_id=1, results=b"\xc1"))
    scheduler.run_until_idle()
    controller.submit(BrokerHeartbeat(GROUP, "b1", 0, 1), answers.append)
    refused = HAControllerResult(ok=False, error="stale")
    requests.sent[1].answer(refused)
    scheduler.run_until_idle()
    assert answers == [None, refused]


def test_closed_calls_end_unknown_and_never_inline() -> None:
    scheduler, _, controller = access()
    answers: list[HAControllerResult | None] = []
    controller.submit(RegisterBroker(GROUP, "b1", "a:1"), answers.append)
    controller.submit(AlterSyncStateSet(GROUP, "b1", 1, 1, ["b1"]), answers.append)
    controller.close()
    controller.submit(BrokerHeartbeat(GROUP, "b1", 0, 1), answers.append)
    assert answers == []
    scheduler.run_until_idle()
    assert answers == [None, None]  # the waiting alter and the heartbeat after the close
