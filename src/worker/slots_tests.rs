use super::*;

fn spec(name: &str, mode: DomainMode, threads: usize, queue: usize) -> LaneSpec {
    LaneSpec {
        name: name.to_owned(),
        mode,
        threads,
        queue,
        paused: false,
        released: false,
        timeout_ms: 1000,
    }
}

/// 6 threads: `pay` RESERVED 2, `mail` MAX 1, `default` the 4 others.
fn slots() -> Slots {
    let mut slots = Slots::new(6, 0, 1000);
    let lanes = slots.apply(vec![
        spec(DEFAULT_DOMAIN, DomainMode::Max, 0, 0),
        spec("pay", DomainMode::Reserved, 2, 0),
        spec("mail", DomainMode::Max, 1, 0),
    ]);
    assert_eq!(lanes, vec![0, 1, 2]);
    slots
}

#[test]
fn reserved_threads_are_kept_and_default_owns_the_rest() {
    let mut slots = slots();
    assert_eq!(slots.shared_capacity(), 4);
    for _ in 0..4 {
        assert_eq!(slots.start(0), Some(Slot::Shared));
    }
    assert_eq!(
        slots.start(0),
        None,
        "default has only the 4 shared threads"
    );
    assert_eq!(
        slots.start(2),
        None,
        "MAX domains run on the shared threads"
    );
    assert_eq!(slots.start(1), Some(Slot::Own));
    assert_eq!(slots.start(1), Some(Slot::Own));
    assert_eq!(slots.start(1), None, "nothing left to borrow");
}

#[test]
fn a_reserved_domain_borrows_free_shared_threads_and_gives_them_back() {
    let mut slots = slots();
    assert_eq!(slots.start(1), Some(Slot::Own));
    assert_eq!(slots.start(1), Some(Slot::Own));
    assert_eq!(slots.start(1), Some(Slot::Shared), "borrowed from default");
    let pay = &slots.usage()[1];
    assert_eq!((pay.running, pay.reserved, pay.borrowed), (3, 2, 1));
    assert_eq!(slots.room(0), 3, "default lost the borrowed thread");
    slots.finish(1, Slot::Shared);
    assert_eq!(slots.usage()[1].borrowed, 0);
    assert_eq!(slots.room(0), 4, "and has it back");
}

#[test]
fn a_max_domain_never_runs_more_than_its_limit() {
    let mut slots = slots();
    assert_eq!(slots.start(2), Some(Slot::Shared));
    assert_eq!(slots.start(2), None);
    assert_eq!(slots.room(2), 0);
    slots.finish(2, Slot::Shared);
    assert_eq!(slots.room(2), 1);
}

#[test]
fn room_is_what_can_start_plus_the_queue_less_what_is_queued() {
    let mut slots = Slots::new(4, 8, 1000);
    assert_eq!(slots.room(0), 12);
    slots.queued(0);
    slots.queued(0);
    assert_eq!(slots.room(0), 10);
    assert_eq!(slots.start(0), Some(Slot::Shared));
    assert_eq!(
        slots.room(0),
        10,
        "a start moves a task from the queue to a thread"
    );
    assert_eq!(slots.bound(), 12);
}

#[test]
fn a_paused_domain_has_no_room_and_a_released_one_gives_its_threads_to_default() {
    let mut slots = slots();
    let mut pay = spec("pay", DomainMode::Reserved, 2, 0);
    pay.paused = true;
    slots.apply(vec![
        spec(DEFAULT_DOMAIN, DomainMode::Max, 0, 0),
        pay.clone(),
        spec("mail", DomainMode::Max, 1, 0),
    ]);
    assert_eq!(slots.room(1), 0);
    assert_eq!(slots.shared_capacity(), 4, "paused keeps its threads");
    pay.released = true;
    slots.apply(vec![
        spec(DEFAULT_DOMAIN, DomainMode::Max, 0, 0),
        pay,
        spec("mail", DomainMode::Max, 1, 0),
    ]);
    assert_eq!(slots.shared_capacity(), 6, "released gives them to default");
    assert_eq!(slots.room(0), 6);
}

#[test]
fn a_released_domains_tasks_still_running_on_its_threads_hold_them() {
    let mut slots = slots();
    slots.queued(1);
    slots.queued(1);
    assert_eq!(slots.start(1), Some(Slot::Own));
    assert_eq!(slots.start(1), Some(Slot::Own));
    let mut pay = spec("pay", DomainMode::Reserved, 2, 0);
    pay.released = true;
    slots.apply(vec![
        spec(DEFAULT_DOMAIN, DomainMode::Max, 0, 0),
        pay,
        spec("mail", DomainMode::Max, 1, 0),
    ]);
    // Its two threads are the shared ones' now, but its two handlers (blocked, say) hold
    // them until they return: default may start 4, not 6.
    assert_eq!(slots.shared_capacity(), 6);
    assert_eq!(slots.room(0), 4);
    assert_eq!(slots.lock_room(0), 4);
    slots.finish(1, Slot::Own);
    assert_eq!(slots.room(0), 5, "one of them returned");
}

#[test]
fn a_stuck_slot_stays_taken_until_its_handler_returns() {
    let mut slots = slots();
    assert_eq!(slots.start(2), Some(Slot::Shared));
    slots.mark_stuck(2);
    assert_eq!(slots.usage()[2].stuck, 1);
    assert_eq!(slots.start(2), None, "not reused");
    slots.unstick(2);
    assert_eq!(slots.usage()[2].stuck, 0);
    assert_eq!(slots.start(2), None, "still running");
    slots.finish(2, Slot::Shared);
    assert_eq!(slots.start(2), Some(Slot::Shared));
}

#[test]
fn a_lane_no_longer_configured_is_paused_and_new_ones_are_added() {
    let mut slots = slots();
    let lanes = slots.apply(vec![
        spec(DEFAULT_DOMAIN, DomainMode::Max, 0, 0),
        spec("sms", DomainMode::Max, 2, 0),
    ]);
    assert_eq!(lanes, vec![0, 3]);
    assert_eq!(slots.len(), 4);
    assert!(slots.spec(1).paused && slots.spec(2).paused);
    assert_eq!(
        slots.shared_capacity(),
        6,
        "pay's reservation ended with it"
    );
}

#[test]
fn claims_are_worth_making_once_a_lane_has_two_thirds_of_its_room() {
    let mut slots = Slots::new(2, 4, 1000);
    assert!(slots.worth_claiming());
    for _ in 0..3 {
        slots.queued(0);
    }
    assert!(!slots.worth_claiming(), "3 of 6");
    assert_eq!(slots.start(0), Some(Slot::Shared));
    slots.finish(0, Slot::Shared);
    assert!(slots.worth_claiming(), "4 of 6");
}

#[test]
fn a_reserved_lane_with_its_own_thread_idle_is_worth_a_claim_whatever_the_shared_ones_do() {
    // Queues of 0, as under lock claims: pay's capacity is its 2 threads and default's 4.
    let mut slots = slots();
    for _ in 0..4 {
        assert_eq!(slots.start(0), Some(Slot::Shared));
    }
    assert_eq!(slots.start(1), Some(Slot::Own));
    assert_eq!(slots.room(1), 1, "one reserved thread of 6 it could run on");
    assert!(slots.worth_claiming_for(1), "pay's second thread idles");
    slots.queued(1);
    assert!(!slots.worth_claiming_for(1), "a task waits for it already");
}

#[test]
fn lock_room_counts_other_lanes_chunks_not_yet_started() {
    let mut slots = slots();
    assert_eq!(slots.lock_room(0), 4);
    assert_eq!(slots.lock_room(1), 6);
    slots.queued(0);
    slots.queued(0);
    assert_eq!(slots.lock_room(0), 2);
    assert_eq!(
        slots.lock_room(1),
        4,
        "default's 2 chunks will take 2 shared threads"
    );
    assert_eq!(slots.lock_room(2), 1);
}

/// A fleet of two databases on two threads, under lock claims (no queue): the first's
/// handlers block on its thread, and it has a chunk waiting for that thread. That chunk
/// cannot start before one of its own ends, so it leaves the second its thread to lock a
/// chunk for (counted against it, the second claimed nothing while the first blocked).
#[test]
fn a_blocked_databases_waiting_chunk_leaves_the_others_their_lock_room() {
    let mut slots = Slots::new(2, 0, 1000);
    let shares = slots.share_out(2, 0);
    for share in &shares {
        slots.set(
            share.lane,
            spec("default", DomainMode::Max, share.threads, share.queue),
        );
    }
    let (blocked, other) = (shares[0].lane, shares[1].lane);
    assert_eq!(slots.start(blocked), Some(Slot::Shared));
    slots.queued(blocked);
    assert_eq!(
        slots.start(blocked),
        None,
        "its chunk waits for its own thread"
    );
    assert_eq!(slots.lock_room(other), 1);
    // A chunk of the other's waiting counts against it, as before.
    slots.queued(other);
    assert_eq!(slots.lock_room(other), 0);
}

/// A `RESERVED` lane's own threads free count for its lock room less its tasks already
/// waiting for them: a chunk claimed the stamping way a moment before, queued and not yet
/// started, takes one of them first.
#[test]
fn a_reserved_lanes_lock_room_leaves_out_what_waits_for_its_own_threads() {
    // 6 threads: `pay` reserves 2, the other 4 are shared.
    let mut slots = slots();
    let pay = 1;
    assert_eq!(slots.lock_room(pay), 2 + 4);
    slots.queued(pay);
    assert_eq!(
        slots.lock_room(pay),
        1 + 4,
        "one own thread taken by what waits"
    );
    assert_eq!(slots.start(pay), Some(Slot::Own));
    assert_eq!(slots.lock_room(pay), 1 + 4, "the same once it started");
}

#[test]
fn a_fleets_databases_share_the_threads_out_and_none_takes_anothers() {
    // 7 threads, a queue of 5, 3 databases: 3, 2, 2 threads; 2, 2, 1 queued.
    let mut slots = Slots::new(7, 5, 1000);
    let shares = slots.share_out(3, 5);
    assert_eq!(
        shares
            .iter()
            .map(|s| (s.lane, s.threads, s.queue))
            .collect::<Vec<_>>(),
        [(1, 3, 2), (2, 2, 2), (3, 2, 1)]
    );
    assert_eq!(slots.bound(), 7 + 5, "the same bound as before the split");
    assert_eq!(slots.room(0), 0, "default runs nothing in a fleet");
    assert!(
        shares.iter().all(|s| slots.room(s.lane) == 0),
        "paused until set"
    );
    for share in &shares {
        slots.set(
            share.lane,
            spec("default", DomainMode::Max, share.threads, share.queue),
        );
    }
    // The first two databases' handlers block on every slot they may take.
    for share in &shares[..2] {
        for _ in 0..share.threads {
            assert_eq!(slots.start(share.lane), Some(Slot::Shared));
        }
        assert_eq!(slots.start(share.lane), None, "at most its share");
        assert_eq!(slots.room(share.lane), share.queue);
        assert!(!slots.idle(share.lane));
    }
    // The third keeps its whole share, to claim for and to start.
    let third = shares[2];
    assert!(slots.idle(third.lane));
    assert!(slots.worth_claiming_for(third.lane));
    assert_eq!(slots.room(third.lane), third.threads + third.queue);
    assert_eq!(slots.lock_room(third.lane), third.threads);
    for _ in 0..third.threads {
        assert_eq!(slots.start(third.lane), Some(Slot::Shared));
    }
    // Setting one lane leaves the others as they are.
    let mut paused = spec("default", DomainMode::Max, third.threads, third.queue);
    paused.paused = true;
    slots.set(third.lane, paused);
    assert_eq!(slots.room(third.lane), 0);
    assert_eq!(slots.room(shares[0].lane), shares[0].queue);
}
