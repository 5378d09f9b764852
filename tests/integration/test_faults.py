"""The fault-injection scenarios of ``make faults`` at small sizes (``streaminfer-faults --quick``).

They start a private broker (the outage scenario stops and restarts it) and a private 3-node cluster (the cluster
scenarios kill and restart its nodes) with harness.localkafka, so they need a JDK and Maven like the rest of
the local path.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.faults import MODEL, QUICK, SCENARIOS, Plan, run, table

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def model_built(digits_model: Path) -> None:
    if not MODEL.exists():  # the harness serves the repository's model, as `make faults` does
        MODEL.parent.mkdir(parents=True, exist_ok=True)
        for name in ("digits.onnx", "heldout.npz", "metrics.json"):
            shutil.copy(digits_model / name, MODEL.parent / name)


#: Twenty-seven scenarios, three on a 3-node cluster, four behind a veth link, two behind toxiproxy, five scale-step
#: rows (about 35 s each in the quick run, whose figures are printed, not judged) and two model-rollout rows (about
#: 40 s each): about 15 minutes on the 2-core CI machine.
@pytest.mark.timeout(1500)
async def test_fault_scenarios_lose_nothing(model_built: None, tmp_path: Path) -> None:
    plan = Plan(**vars(QUICK))
    outcomes = await run(plan, None, tmp_path)
    print(table(outcomes))
    assert [o.scenario for o in outcomes] == list(SCENARIOS)
    failed = [o for o in outcomes if not o.ok]
    assert not failed, table(failed)
    assert sum(o.lost for o in outcomes) == 0
    assert sum(o.duplicates for o in outcomes if o.exactly_once) == 0
    assert sum(o.poison_missed for o in outcomes) == 0
