"""The publish store on local disk under concurrent calls: each removes the shared temporary folder once it
leaves it empty, and no other call may fail for it."""

import threading

from preprocess.publish import store as dataset_store


def test_concurrent_creates_and_writes_never_lose_their_folders_and_one_create_wins_each_name(tmp_path):
    # Threads race on the shared staging/.tmp folder: one call's cleanup could remove it between another's
    # makedirs and its open (FileNotFoundError; seen with 8 job-record launchers at once).
    errors, wins = [], {}
    lock = threading.Lock()

    def calls(thread: int):
        store = dataset_store.open_store(str(tmp_path))
        for round_ in range(600):
            try:
                if store.create_if_absent(f"claims/{round_ % 50}.json", f"{thread}".encode()):
                    with lock:
                        wins[round_ % 50] = wins.get(round_ % 50, 0) + 1
                store.create_if_absent(f"own/{thread}-{round_}.json", b"x")
                store.write(f"copies/{thread}.json", f"{round_}".encode())
            except Exception as exc:  # noqa: BLE001 - every failure is reported by the assertion below
                errors.append(repr(exc))

    threads = [threading.Thread(target=calls, args=(thread,)) for thread in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert wins == {name: 1 for name in range(50)}
    assert len(list((tmp_path / "own").iterdir())) == 8 * 600
