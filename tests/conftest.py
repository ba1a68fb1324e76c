"""What every test run shares."""
import pytest
from hypothesis import settings

# Property tests are checked by their examples, not timed: the unit tests run beside the VM study's emulation.
settings.register_profile("shared-machine", deadline=None)
settings.load_profile("shared-machine")


@pytest.fixture(scope="session", autouse=True)
def _vm_beside_the_unit_tests(request):
    """The VM study (tests/integration/test_vm.py) boots and runs under emulation for over a minute and needs no
    OVS: started before the first test, it runs beside the unit tests, which come first, and its module waits
    only for what is left."""
    if any(item.module.__name__ == "tests.integration.test_vm" for item in request.session.items):
        from tests.integration import test_vm
        test_vm.start()
    yield
