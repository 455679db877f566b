use super::*;

fn row(name: &str) -> DomainRow {
    DomainRow {
        name: name.to_owned(),
        keywords: None,
        mode: None,
        threads: None,
        queue: None,
        timeout_ms: None,
        paused: false,
        released: false,
        held_keywords: None,
        version: 1,
        updated_at: String::new(),
        updated_by: String::new(),
    }
}

fn control(domains: Vec<Domain>) -> DomainControl {
    control_with(domains, false)
}

fn control_with(domains: Vec<Domain>, lock: bool) -> DomainControl {
    let base = Base {
        threads: 6,
        queue: 10,
        task_timeout: Duration::from_secs(60),
        commit_batch: 1,
        lock,
        domains,
        registered: ["a", "b", "c", "d"].map(String::from).to_vec(),
        share: None,
    };
    let lanes = Arc::new(Lanes::new(super::super::slots::Slots::new(6, 10, 60_000)));
    DomainControl::new(base, lanes).unwrap()
}

#[test]
fn without_domains_default_claims_every_registered_keyword() {
    let control = control(Vec::new());
    let plan = control.plan();
    assert!(!plan.by_lanes());
    assert_eq!(plan.lanes[0].keywords, ["a", "b", "c", "d"]);
    assert_eq!(plan.lanes[0].timeout, Duration::from_secs(60));
}

#[test]
fn a_domain_takes_its_keywords_from_default() {
    let control = control(vec![
        Domain::reserved("pay", ["b"], 2).timeout(Duration::from_secs(5))
    ]);
    let plan = control.plan();
    assert_eq!(plan.lanes[0].keywords, ["a", "c", "d"]);
    assert_eq!(plan.lanes[1].keywords, ["b"]);
    assert_eq!(plan.lanes[1].timeout, Duration::from_secs(5));
    assert_eq!(plan.lane_of("b"), 1);
    assert_eq!(plan.lane_of("a"), 0);
}

#[test]
fn rows_override_the_configuration_and_add_domains() {
    let control = control(vec![Domain::reserved("pay", ["b"], 2)]);
    let mut pay = row("pay");
    pay.threads = Some(3);
    pay.paused = true;
    let mut mail = row("mail");
    mail.keywords = Some(r#"["c","zzz"]"#.into());
    mail.mode = Some("max".into());
    mail.threads = Some(1);
    let mut other = row("elsewhere");
    other.paused = true;
    control
        .apply(&[pay, mail, other], &["d".to_owned()])
        .unwrap();
    let plan = control.plan();
    assert_eq!(
        plan.lanes.len(),
        3,
        "pay, mail; a pause of an unknown domain is ignored"
    );
    assert_eq!(plan.lanes[0].keywords, ["a"], "d is paused on its own");
    assert!(plan.lanes[1].keywords.is_empty(), "pay is paused");
    assert_eq!(
        plan.lanes[2].keywords,
        ["c"],
        "only the registered keywords"
    );
    let published: NodeDomains = serde_json::from_str(&control.publication()).unwrap();
    assert_eq!(published.threads, 6);
    let pay = &published.domains[1];
    assert_eq!(
        (pay.domain.as_str(), pay.reserved, pay.paused),
        ("pay", 3, true)
    );
    assert_eq!(published.domains[0].threads, 3, "default keeps the rest");
}

#[test]
fn an_invalid_row_changes_nothing() {
    let control = control(vec![Domain::reserved("pay", ["b"], 2)]);
    let before = control.plan();
    let mut pay = row("pay");
    pay.threads = Some(6);
    let err = control.apply(&[pay], &[]).unwrap_err().to_string();
    assert!(
        err.contains("\"pay\"") && err.contains("must keep at least one"),
        "{err}"
    );
    assert_eq!(control.plan(), before);
    let mut mail = row("mail");
    mail.keywords = Some(r#"["b"]"#.into());
    mail.mode = Some("max".into());
    mail.threads = Some(1);
    let err = control.apply(&[mail], &[]).unwrap_err().to_string();
    assert!(err.contains("which domain \"pay\" lists too"), "{err}");
}

#[test]
fn a_released_domain_gives_its_threads_to_default_and_claims_nothing() {
    let control = control(vec![Domain::reserved("pay", ["b"], 5)]);
    let mut pay = row("pay");
    pay.released = true;
    control.apply(&[pay], &[]).unwrap();
    let published: NodeDomains = serde_json::from_str(&control.publication()).unwrap();
    assert_eq!(published.domains[0].threads, 6);
    assert_eq!(published.domains[1].reserved, 0);
    assert!(control.plan().lanes[1].keywords.is_empty());
}

#[test]
fn a_domains_default_queue_is_8_per_thread_it_can_run_on_and_none_under_lock_claims() {
    // 6 threads: pay RESERVED 1 leaves default 5, which pay may borrow and mail MAX 2 runs on.
    let domains = || {
        vec![
            Domain::reserved("pay", ["b"], 1),
            Domain::max("mail", ["c"], 2),
            Domain::max("sms", ["d"], 1).queue(3),
        ]
    };
    let queues = |control: &DomainControl| -> Vec<usize> {
        let plan = control.plan();
        let slots = control.lanes.lock();
        plan.lanes
            .iter()
            .map(|l| slots.spec(l.lane).queue)
            .collect()
    };
    assert_eq!(queues(&control_with(domains(), false)), [10, 48, 16, 3]);
    assert_eq!(queues(&control_with(domains(), true)), [0, 0, 0, 0]);
}

#[test]
fn a_paused_domains_held_keywords_are_claimed_by_no_lane_even_without_the_domain() {
    // No domain `slow` here: its keyword b is default's, but not while `slow` holds it.
    for shared_pool in [false, true] {
        let lanes = Arc::new(Lanes::new(super::super::slots::Slots::new(6, 10, 60_000)));
        let base = Base {
            threads: 6,
            queue: 10,
            task_timeout: Duration::from_secs(60),
            commit_batch: 1,
            lock: false,
            domains: Vec::new(),
            registered: ["a", "b", "c", "d"].map(String::from).to_vec(),
            share: shared_pool.then(|| lanes.share_out(2, 10)[1]),
        };
        let control = DomainControl::new(base, lanes).unwrap();
        let mut slow = row("slow");
        slow.paused = true;
        slow.held_keywords = Some(r#"["b","zzz"]"#.into());
        control.apply(&[slow.clone()], &[]).unwrap();
        assert_eq!(
            control.plan().lanes[0].keywords,
            ["a", "c", "d"],
            "shared pool: {shared_pool}"
        );
        let published: NodeDomains = serde_json::from_str(&control.publication()).unwrap();
        assert_eq!(
            published.domains[0].keywords,
            ["a", "b", "c", "d"],
            "published, held or not"
        );
        // A row no longer paused holds nothing, whatever list it kept.
        slow.paused = false;
        control.apply(&[slow], &[]).unwrap();
        assert_eq!(control.plan().lanes[0].keywords, ["a", "b", "c", "d"]);
    }
}

#[test]
fn a_paused_domain_still_publishes_its_keywords() {
    // What a pause right after a resume records as held: the node may not have applied the
    // resume yet.
    let control = control(vec![Domain::max("pay", ["b"], 1)]);
    let mut pay = row("pay");
    pay.paused = true;
    control.apply(&[pay], &["a".to_owned()]).unwrap();
    assert!(control.plan().lanes[1].keywords.is_empty());
    let published: NodeDomains = serde_json::from_str(&control.publication()).unwrap();
    assert_eq!(published.domains[1].keywords, ["b"]);
    assert_eq!(
        published.domains[0].keywords,
        ["a", "c", "d"],
        "a keyword paused on its own too"
    );
}

#[test]
fn on_a_fleets_shared_pool_each_database_sets_and_pauses_only_its_own_lane() {
    let lanes = Arc::new(Lanes::new(super::super::slots::Slots::new(5, 4, 60_000)));
    let shares = lanes.share_out(2, 4);
    let controls: Vec<DomainControl> = shares
        .iter()
        .map(|&share| {
            let base = Base {
                threads: 5,
                queue: 4,
                task_timeout: Duration::from_secs(60),
                commit_batch: 1,
                lock: false,
                domains: Vec::new(),
                registered: ["a", "b"].map(String::from).to_vec(),
                share: Some(share),
            };
            DomainControl::new(base, Arc::clone(&lanes)).unwrap()
        })
        .collect();
    for (control, share) in controls.iter().zip(&shares) {
        let plan = control.plan();
        assert!(plan.by_lanes(), "claims sized by the database's own lane");
        assert_eq!(plan.lane_of("a"), share.lane);
        assert_eq!(plan.claiming(), [share.lane]);
        let published: NodeDomains = serde_json::from_str(&control.publication()).unwrap();
        assert_eq!(
            published.domains.len(),
            1,
            "only its own lane: {published:?}"
        );
        assert_eq!(published.domains[0].domain, DEFAULT_DOMAIN);
        assert_eq!(published.domains[0].threads, share.threads);
    }
    assert_eq!(
        (
            shares[0].threads,
            shares[1].threads,
            shares[0].queue,
            shares[1].queue
        ),
        (3, 2, 2, 2)
    );
    // The first database's `default` paused: its lane claims nothing; the second's lane
    // keeps its room, also when the first applies its rows again.
    let mut paused = row(DEFAULT_DOMAIN);
    paused.paused = true;
    controls[0].apply(&[paused.clone()], &[]).unwrap();
    controls[0].apply(&[paused], &[]).unwrap();
    assert!(controls[0].plan().claiming().is_empty());
    assert_eq!(controls[1].plan().claiming(), [shares[1].lane]);
    let slots = lanes.lock();
    assert_eq!(slots.room(shares[0].lane), 0);
    assert_eq!(
        slots.room(shares[1].lane),
        2 + 2,
        "its threads and its queue"
    );
}
