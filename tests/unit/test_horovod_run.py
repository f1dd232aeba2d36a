"""``horovod.run`` (Horovod's programmatic launcher) is refused with one line naming the launcher."""
import pytest

import hpctrain.horovod as horovod
from hpctrain.errors import UserError


def test_run_is_refused_naming_mpiexec():
    with pytest.raises(UserError) as info:
        horovod.run(print, args=(1,), np=2, hosts="localhost:2")
    message = str(info.value)
    assert "\n" not in message and "horovod.run is not supported" in message and "mpiexec -n N" in message
