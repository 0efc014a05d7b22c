"""Rate limits in tests do not depend on where the wall clock is in its minute."""

import time


def test_a_rate_window_does_not_end_between_a_tests_requests(client, make_order, settings):
    # given: one notice a minute
    settings.ORDER_NOTICE_RATE = "1/m"
    order = make_order()
    paid = f"/order/t/{order.tracking_token}/paid/"
    real_time = time.time
    start = real_time()

    # when: the wall clock moves a whole window (61 s) between two requests, as a
    # slice's end can fall between them on any day
    try:
        first = client.post(paid).status_code
        time.time = lambda: start + 61  # type: ignore[assignment]
        second = client.post(paid).status_code
    finally:
        time.time = real_time  # type: ignore[assignment]

    # then: the test's clock stood still, so the second is the one refused
    assert (first, second) == (302, 429)
