use serde_json::json;

use super::*;

fn check(filter: Value, event: &Value) -> bool {
    Filter::compile(&filter)
        .unwrap_or_else(|e| panic!("{filter} refused: {e}"))
        .matches(event)
}

fn event() -> Value {
    json!({
        "id": "evt_1",
        "type": "invoice.paid",
        "amount": 1250,
        "fee": 12.5,
        "big": 18446744073709551615u64,
        "neg": -9223372036854775808i64,
        "currency": "EUR",
        "tags": ["new", "hot"],
        "matrix": [[1, 2], [3]],
        "note": null,
        "paid": true,
        "customer": {"tier": "gold", "name": "Zoë Ünal", "address": {"city": "Zürich"}},
        "items": [{"sku": "A1", "qty": 2}, {"sku": "B2", "qty": 5}, "loose"],
        "a/b": 1,
        "t~x": 2,
        "emoji": "🎉 party"
    })
}

/// Each case: a filter against [`event`], and whether it matches.
fn check_all(cases: Vec<(&str, Value, bool)>) {
    let e = event();
    for (name, filter, expected) in cases {
        assert_eq!(check(filter.clone(), &e), expected, "{name}: {filter}");
    }
}

#[test]
fn plain_keys_and_equality() {
    check_all(vec![
        // Plain keys: equality, nested objects, all keys at once.
        ("empty filter", json!({}), true),
        ("string eq", json!({"currency": "EUR"}), true),
        ("string eq, other case", json!({"currency": "eur"}), false),
        ("two keys", json!({"currency": "EUR", "paid": true}), true),
        (
            "two keys, one wrong",
            json!({"currency": "EUR", "paid": false}),
            false,
        ),
        ("nested", json!({"customer": {"tier": "gold"}}), true),
        (
            "nested deeper",
            json!({"customer": {"address": {"city": "Zürich"}}}),
            true,
        ),
        (
            "nested wrong",
            json!({"customer": {"tier": "silver"}}),
            false,
        ),
        ("null equals null", json!({"note": null}), true),
        ("escaped keys", json!({"a/b": 1, "t~x": 2}), true),
        // $eq / $neq
        ("$eq", json!({"amount": {"$eq": 1250}}), true),
        ("$eq float form", json!({"amount": {"$eq": 1250.0}}), true),
        ("$eq float", json!({"fee": {"$eq": 12.5}}), true),
        (
            "$eq object literal",
            json!({"customer": {"address": {"$eq": {"city": "Zürich"}}}}),
            true,
        ),
        (
            "$eq object literal, extra key",
            json!({"customer": {"$eq": {"tier": "gold"}}}),
            false,
        ),
        ("$eq whole array", json!({"tags": ["new", "hot"]}), true),
        (
            "$eq array, other order",
            json!({"tags": ["hot", "new"]}),
            false,
        ),
        ("$neq", json!({"currency": {"$neq": "USD"}}), true),
        ("$neq same", json!({"currency": {"$neq": "EUR"}}), false),
        (
            "$neq null on a value",
            json!({"amount": {"$neq": null}}),
            true,
        ),
    ]);
}

#[test]
fn comparisons_by_value() {
    check_all(vec![
        // Comparisons: numbers of both kinds, exactly.
        ("$gt int", json!({"amount": {"$gt": 1000}}), true),
        ("$gt equal", json!({"amount": {"$gt": 1250}}), false),
        ("$gte equal", json!({"amount": {"$gte": 1250}}), true),
        ("$lt float bound", json!({"amount": {"$lt": 1250.5}}), true),
        (
            "$lte float bound",
            json!({"amount": {"$lte": 1249.9}}),
            false,
        ),
        ("$gt on float", json!({"fee": {"$gt": 12}}), true),
        ("$lt on float", json!({"fee": {"$lt": 13}}), true),
        (
            "range",
            json!({"amount": {"$gte": 1000, "$lt": 2000}}),
            true,
        ),
        (
            "range outside",
            json!({"amount": {"$gte": 2000, "$lt": 3000}}),
            false,
        ),
        (
            "u64 max exact",
            json!({"big": {"$eq": 18446744073709551615u64}}),
            true,
        ),
        (
            "u64 max vs max-1",
            json!({"big": {"$gt": 18446744073709551614u64}}),
            true,
        ),
        (
            "u64 max vs 2^64 float",
            json!({"big": {"$lt": 18446744073709551616.0}}),
            true,
        ),
        (
            "u64 max not equal float",
            json!({"big": {"$eq": 18446744073709551616.0}}),
            false,
        ),
        (
            "i64 min exact",
            json!({"neg": {"$eq": -9223372036854775808i64}}),
            true,
        ),
        ("i64 min vs u64", json!({"neg": {"$lt": 1u64}}), true),
        ("i64 min vs float", json!({"neg": {"$gte": -9.3e18}}), true),
        ("huge float", json!({"big": {"$lt": 1e300}}), true),
        ("negative huge float", json!({"neg": {"$gt": -1e300}}), true),
        (
            "comparison on a string",
            json!({"currency": {"$gt": 0}}),
            false,
        ),
        ("comparison on null", json!({"note": {"$lt": 1}}), false),
    ]);
}

#[test]
fn membership_and_missing_fields() {
    check_all(vec![
        // $in / $nin
        ("$in", json!({"currency": {"$in": ["USD", "EUR"]}}), true),
        (
            "$in none",
            json!({"currency": {"$in": ["USD", "GBP"]}}),
            false,
        ),
        ("$in empty", json!({"currency": {"$in": []}}), false),
        ("$in numbers", json!({"amount": {"$in": [1, 1250.0]}}), true),
        ("$nin", json!({"currency": {"$nin": ["USD", "GBP"]}}), true),
        ("$nin hit", json!({"currency": {"$nin": ["EUR"]}}), false),
        ("$nin empty", json!({"currency": {"$nin": []}}), true),
        // $exist and missing fields.
        ("$exist true", json!({"amount": {"$exist": true}}), true),
        ("$exist null value", json!({"note": {"$exist": true}}), true),
        (
            "$exist false on present",
            json!({"amount": {"$exist": false}}),
            false,
        ),
        (
            "$exist false on missing",
            json!({"nope": {"$exist": false}}),
            true,
        ),
        (
            "$exist true on missing",
            json!({"nope": {"$exist": true}}),
            false,
        ),
        ("missing eq", json!({"nope": "x"}), false),
        ("missing eq null", json!({"nope": null}), false),
        ("missing neq", json!({"nope": {"$neq": "x"}}), true),
        ("missing nin", json!({"nope": {"$nin": ["x"]}}), true),
        ("missing in", json!({"nope": {"$in": ["x"]}}), false),
        ("missing gt", json!({"nope": {"$gt": 0}}), false),
        (
            "path through a scalar",
            json!({"currency": {"code": "EUR"}}),
            false,
        ),
        (
            "path through a scalar, $exist false",
            json!({"currency": {"code": {"$exist": false}}}),
            true,
        ),
    ]);
}

#[test]
fn strings() {
    check_all(vec![
        // Strings, unicode.
        (
            "$startsWith",
            json!({"type": {"$startsWith": "invoice."}}),
            true,
        ),
        (
            "$startsWith no",
            json!({"type": {"$startsWith": "order."}}),
            false,
        ),
        ("$endsWith", json!({"type": {"$endsWith": ".paid"}}), true),
        (
            "$endsWith unicode",
            json!({"customer": {"name": {"$endsWith": "Ünal"}}}),
            true,
        ),
        (
            "$startsWith emoji",
            json!({"emoji": {"$startsWith": "🎉"}}),
            true,
        ),
        (
            "unicode eq",
            json!({"customer": {"name": "Zoë Ünal"}}),
            true,
        ),
        (
            "unicode not normalised",
            json!({"customer": {"name": "Zoe\u{0308} Ünal"}}),
            false,
        ),
        (
            "$startsWith on number",
            json!({"amount": {"$startsWith": "1"}}),
            false,
        ),
        (
            "$endsWith empty",
            json!({"currency": {"$endsWith": ""}}),
            true,
        ),
    ]);
}

#[test]
fn arrays() {
    check_all(vec![
        // Arrays: any element; the array itself; keys into arrays of objects.
        ("array any element", json!({"tags": "hot"}), true),
        ("array no element", json!({"tags": "cold"}), false),
        ("array $in", json!({"tags": {"$in": ["cold", "new"]}}), true),
        (
            "array $neq an element",
            json!({"tags": {"$neq": "hot"}}),
            false,
        ),
        ("array $nin", json!({"tags": {"$nin": ["cold"]}}), true),
        (
            "array $startsWith",
            json!({"tags": {"$startsWith": "ho"}}),
            true,
        ),
        ("array in array", json!({"matrix": [3]}), true),
        ("array one level only", json!({"matrix": 3}), false),
        (
            "key into array items",
            json!({"items": {"sku": "B2"}}),
            true,
        ),
        (
            "key into array items, none",
            json!({"items": {"sku": "C3"}}),
            false,
        ),
        (
            "key into items, comparison",
            json!({"items": {"qty": {"$gt": 4}}}),
            true,
        ),
        (
            "key into items, $neq",
            json!({"items": {"sku": {"$neq": "A1"}}}),
            false,
        ),
        (
            "key into items, $exist",
            json!({"items": {"price": {"$exist": false}}}),
            true,
        ),
        ("array $exist", json!({"tags": {"$exist": true}}), true),
    ]);
}

#[test]
fn logical_lists() {
    check_all(vec![
        // Logical lists.
        (
            "$or",
            json!({"$or": [{"currency": "USD"}, {"amount": {"$gt": 1000}}]}),
            true,
        ),
        (
            "$or none",
            json!({"$or": [{"currency": "USD"}, {"amount": {"$gt": 5000}}]}),
            false,
        ),
        (
            "$and",
            json!({"$and": [{"currency": "EUR"}, {"paid": true}]}),
            true,
        ),
        (
            "$and one fails",
            json!({"$and": [{"currency": "EUR"}, {"paid": false}]}),
            false,
        ),
        ("$not", json!({"$not": [{"currency": "USD"}]}), true),
        (
            "$not any",
            json!({"$not": [{"currency": "USD"}, {"paid": true}]}),
            false,
        ),
        (
            "$or on a field",
            json!({"amount": {"$or": [{"$lt": 10}, {"$gt": 1000}]}}),
            true,
        ),
        (
            "$not on a field",
            json!({"amount": {"$not": [{"$gt": 1000}]}}),
            false,
        ),
        (
            "$not on missing",
            json!({"nope": {"$not": [{"$eq": 1}]}}),
            true,
        ),
        (
            "mixed",
            json!({"type": {"$startsWith": "invoice."}, "$or": [{"customer": {"tier": {"$in": ["gold", "platinum"]}}}, {"amount": {"$gte": 10000}}], "$not": [{"tags": "test"}]}),
            true,
        ),
    ]);
    // Not an object at the top: nothing under it is a field.
    assert!(!check(json!({"a": 1}), &json!([{"a": 2}, 3])));
    assert!(check(json!({"a": 1}), &json!([{"a": 1}])));
    assert!(!check(json!({"a": 1}), &json!("a")));
}

#[test]
fn refusals_name_the_place() {
    let deep = |n: usize| {
        let mut v = json!(1);
        for _ in 0..n {
            v = json!({ "a": v });
        }
        v
    };
    let many: Map<String, Value> = (0..=MAX_CLAUSES)
        .map(|i| (format!("k{i:03}"), json!(i)))
        .collect();
    let cases: Vec<(Value, &str)> = vec![
        (json!([]), "filter: expected an object"),
        (json!("x"), "filter: expected an object"),
        (json!(null), "filter: expected an object"),
        (
            json!({"amount": {"$gt": "5"}}),
            "filter/amount/$gt: expected a number",
        ),
        (
            json!({"amount": {"$lte": null}}),
            "filter/amount/$lte: expected a number",
        ),
        (json!({"a": {"$in": 5}}), "filter/a/$in: expected a list"),
        (
            json!({"a": {"$nin": {"x": 1}}}),
            "filter/a/$nin: expected a list",
        ),
        (
            json!({"a": {"$exist": "yes"}}),
            "filter/a/$exist: expected true or false",
        ),
        (
            json!({"a": {"$startsWith": 1}}),
            "filter/a/$startsWith: expected a string",
        ),
        (
            json!({"a": {"$endsWith": ["x"]}}),
            "filter/a/$endsWith: expected a string",
        ),
        (
            json!({"$or": []}),
            "filter/$or: expected a non-empty list of filter objects",
        ),
        (
            json!({"$and": {"a": 1}}),
            "filter/$and: expected a non-empty list of filter objects",
        ),
        (
            json!({"$not": [{"a": 1}, 2]}),
            "filter/$not/1: expected a filter object",
        ),
        (
            json!({"$or": [{"a": {"$gt": true}}]}),
            "filter/$or/0/a/$gt: expected a number",
        ),
        (
            json!({"a/b": {"$regex": "x"}}),
            "filter/a~1b/$regex: unknown operator",
        ),
        (
            json!({"x": {"y~": {"$exists": true}}}),
            "filter/x/y~0/$exists: unknown operator",
        ),
        (json!({"$where": "1"}), "filter/$where: unknown operator"),
        (
            deep(MAX_DEPTH + 1),
            "filter/a/a/a/a/a/a/a/a: nested deeper than 8 levels",
        ),
        (
            json!({"a": {"$eq": [[[[[[[[1]]]]]]]]}}),
            "filter/a/$eq: nested deeper than 8 levels",
        ),
        (Value::Object(many), "filter/k100: more than 100 conditions"),
        (
            json!({"a": {"$in": vec![0; MAX_LIST + 1]}}),
            "filter/a/$in: 257 values; the limit is 256",
        ),
        (
            json!({"a": "x".repeat(MAX_FILTER_BYTES)}),
            "filter: 16392 bytes; the limit is 16384",
        ),
    ];
    for (filter, expected) in cases {
        let got = Filter::compile(&filter)
            .map(|_| ())
            .map_err(|e| e.to_string());
        match got {
            Err(msg) => assert!(
                msg.starts_with(expected),
                "{filter}: {msg} (wanted {expected})"
            ),
            Ok(()) => panic!("{filter} was accepted; wanted {expected}"),
        }
    }
    // The limits themselves are accepted.
    assert!(Filter::compile(&deep(MAX_DEPTH)).is_ok());
    assert!(Filter::compile(&json!({"a": {"$in": vec![0; MAX_LIST]}})).is_ok());
    assert!(Filter::parse("{\"a\":").is_err());
}

#[test]
fn exact_number_comparison() {
    let n = |v: Value| match v {
        Value::Number(n) => n,
        _ => unreachable!(),
    };
    let cases: Vec<(Value, Value, Ordering)> = vec![
        (json!(1), json!(1.0), Ordering::Equal),
        (json!(-1), json!(1u64), Ordering::Less),
        (
            json!(9007199254740993u64),
            json!(9007199254740992.0),
            Ordering::Greater,
        ),
        (
            json!(9007199254740992u64),
            json!(9007199254740992.0),
            Ordering::Equal,
        ),
        (json!(-3), json!(-2.5), Ordering::Less),
        (json!(-2), json!(-2.5), Ordering::Greater),
        (json!(2), json!(2.5), Ordering::Less),
        (json!(0.1), json!(0.2), Ordering::Less),
        (json!(i64::MIN), json!(u64::MAX), Ordering::Less),
    ];
    for (a, b, o) in cases {
        assert_eq!(cmp_numbers(&n(a.clone()), &n(b.clone())), o, "{a} vs {b}");
        assert_eq!(
            cmp_numbers(&n(b.clone()), &n(a.clone())),
            o.reverse(),
            "{b} vs {a}"
        );
    }
}

/// A projection keeps what filters test, whole, and the presence of what they ask exists;
/// nothing else.
#[test]
fn projections_keep_what_filters_see() {
    let text = event().to_string();
    let seen = |f: Value| {
        let p = Filter::compile(&f).unwrap().projection();
        p.parse(&text).unwrap()
    };
    let cases: Vec<(Value, Value)> = vec![
        (json!({}), json!({})),
        (json!({"currency": "EUR"}), json!({"currency": "EUR"})),
        (
            json!({"customer": {"address": {"$exist": true}}}),
            json!({"customer": {"address": {}}}),
        ),
        (
            json!({"items": {"sku": "A1"}, "$or": [{"paid": true}, {"note": null}]}),
            json!({"items": [{"sku": "A1"}, {"sku": "B2"}, "loose"], "paid": true, "note": null}),
        ),
        (
            json!({"customer": {"$eq": {"tier": "gold"}}, "customer ": 1}),
            json!({"customer": event()["customer"].clone()}),
        ),
    ];
    for (f, want) in cases {
        assert_eq!(seen(f.clone()), want, "{f}");
    }
    let mut both = Filter::compile(&json!({"a/b": 1})).unwrap().projection();
    both.add(
        &Filter::compile(&json!({"t~x": {"$gt": 1}}))
            .unwrap()
            .projection(),
    );
    assert_eq!(both.parse(&text).unwrap(), json!({"a/b": 1, "t~x": 2}));
    assert!(both.parse("{\"a/b\": 1} x").is_err());
}

#[test]
fn cache_compiles_once_and_keys_by_text() {
    let mut cache = FilterCache::default();
    let a = cache.get(r#"{"a":1}"#).unwrap().unwrap();
    let again = cache.get(r#"{"a":1}"#).unwrap().unwrap();
    assert!(Arc::ptr_eq(&a, &again));
    let b = cache.get(r#"{"a":2}"#).unwrap().unwrap();
    assert!(!Arc::ptr_eq(&a, &b));
    // A text that does not compile is reported once, then lets events through.
    assert!(cache.get(r#"{"a":{"$bad":1}}"#).is_err());
    assert_eq!(cache.get(r#"{"a":{"$bad":1}}"#), Ok(None));
}

/// A small deterministic generator (SplitMix64), so a failure replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len() as u64) as usize]
    }
}

const KEYS: &[&str] = &["a", "b", "é", "$x", "", "a/b"];

fn scalar(r: &mut Rng) -> Value {
    match r.below(9) {
        0 => Value::Null,
        1 => json!(r.below(2) == 0),
        2 => json!(r.below(5) as i64 - 2),
        3 => json!(u64::MAX - r.below(3)),
        4 => json!(i64::MIN + r.below(3) as i64),
        5 => json!((r.below(9) as f64 - 4.0) / 2.0),
        6 => json!(*r.pick(&["", "x", "xy", "ÿ", "🎉", "a\u{0}b"])),
        7 => json!(1e300 * if r.below(2) == 0 { 1.0 } else { -1.0 }),
        _ => json!(r.pick(KEYS).to_string()),
    }
}

fn body(r: &mut Rng, depth: u32) -> Value {
    if depth == 0 || r.below(3) == 0 {
        return scalar(r);
    }
    if r.below(2) == 0 {
        Value::Array((0..r.below(4)).map(|_| body(r, depth - 1)).collect())
    } else {
        Value::Object(
            (0..r.below(4))
                .map(|_| (r.pick(KEYS).to_string(), body(r, depth - 1)))
                .collect(),
        )
    }
}

const OPS: &[&str] = &[
    "$eq",
    "$neq",
    "$gt",
    "$gte",
    "$lt",
    "$lte",
    "$in",
    "$nin",
    "$exist",
    "$startsWith",
    "$endsWith",
    "$or",
    "$and",
    "$not",
    "$bogus",
];

/// A random filter: mostly valid, sometimes not (wrong operands, unknown operators, too deep).
fn filter(r: &mut Rng, depth: u32) -> Value {
    let mut m = Map::new();
    for _ in 0..r.below(4) {
        let key = *if r.below(2) == 0 {
            r.pick(KEYS)
        } else {
            r.pick(OPS)
        };
        let v = match key {
            "$or" | "$and" | "$not" if depth > 0 => {
                Value::Array((0..1 + r.below(3)).map(|_| filter(r, depth - 1)).collect())
            }
            "$in" | "$nin" => Value::Array((0..r.below(4)).map(|_| body(r, 1)).collect()),
            "$exist" if r.below(8) != 0 => json!(r.below(2) == 0),
            _ if depth > 0 && r.below(3) == 0 => filter(r, depth - 1),
            _ => body(r, 2),
        };
        m.insert(key.to_string(), v);
    }
    Value::Object(m)
}

/// Random filters against random bodies: never a panic, and the logical operators keep their
/// laws: `$not:[f]` is `!f`, `$and:[f]` and `$or:[f]` are `f`, `$neq` is `!$eq`, `$nin` is
/// `!$in`, and a filter's compiled form matches as its stored text does.
#[test]
fn fuzz_random_filters_and_bodies() {
    let mut r = Rng(0x5eed_f11e);
    let (mut compiled, mut matched) = (0, 0);
    for _ in 0..20_000 {
        let f = filter(&mut r, 3);
        let e = body(&mut r, 4);
        let Ok(cf) = Filter::compile(&f) else {
            continue;
        };
        compiled += 1;
        let m = cf.matches(&e);
        matched += usize::from(m);
        // A wrapped filter may pass the depth limit: then it says so, and there is no law.
        let law = |g: Value| match Filter::compile(&g) {
            Ok(g) => Some(g.matches(&e)),
            Err(err) => {
                assert!(err.message.starts_with("nested deeper"), "{g}: {err}");
                None
            }
        };
        let holds = |got: Option<bool>, want: bool| got.is_none_or(|g| g == want);
        assert!(
            holds(law(json!({"$not": [f.clone()]})), !m),
            "$not {f} on {e}"
        );
        assert!(
            holds(law(json!({"$and": [f.clone()]})), m),
            "$and {f} on {e}"
        );
        assert!(
            holds(law(json!({"$or": [f.clone(), {"$not": [{}]}]})), m),
            "$or {f} on {e}"
        );
        assert_eq!(Filter::parse(&f.to_string()).map(|g| g.matches(&e)), Ok(m));
        // Read through its projection, or a wider one (another filter's added), the body
        // matches as it does whole.
        let text = e.to_string();
        let mut seen = cf.projection();
        let projected = seen.parse(&text).expect("projected parse");
        assert_eq!(
            cf.matches(&projected),
            m,
            "{f} on {e} projected as {projected}"
        );
        if let Ok(other) = Filter::compile(&filter(&mut r, 3)) {
            seen.add(&other.projection());
            let wider = seen.parse(&text).expect("projected parse");
            assert_eq!(cf.matches(&wider), m, "{f} on {e} projected as {wider}");
            assert_eq!(other.matches(&wider), other.matches(&e), "the other on {e}");
        }
        let x = body(&mut r, 1);
        for key in ["a", "é"] {
            let eq = law(json!({ key: {"$eq": x.clone()} })).expect("eq");
            assert_eq!(law(json!({ key: {"$neq": x.clone()} })), Some(!eq));
            let inn = law(json!({ key: {"$in": [x.clone()]} })).expect("in");
            assert_eq!(inn, eq, "$in [{x}] is $eq {x} on {e}");
            assert_eq!(law(json!({ key: {"$nin": [x.clone()]} })), Some(!inn));
        }
    }
    // The generator reaches both outcomes, and accepts and refuses filters.
    assert!(compiled > 2_000 && compiled < 20_000, "{compiled} compiled");
    assert!(
        matched > 200 && matched < compiled - 200,
        "{matched} of {compiled} matched"
    );
}

/// Matching is metered: an `$in` list is one lookup per value whatever its length, and a match
/// given fewer steps than it takes stops with `TooCostly`, giving the same answer otherwise.
#[test]
fn cost_is_counted_in_steps_and_capped() {
    let list: Vec<Value> = (0..MAX_LIST).map(|i| json!(format!("v{i}"))).collect();
    let tags: Vec<String> = (0..10_000).map(|i| format!("t{i}")).collect();
    let nums: Vec<u32> = (0..1000).collect();
    let body = json!({ "tags": tags, "n": 5, "nums": nums });
    let cases: Vec<(Value, bool, u64)> = vec![
        // One step per tag (and a few): the 256 listed values cost nothing more.
        (json!({"tags": {"$in": list.clone()}}), false, 10_010),
        (json!({"tags": {"$nin": list.clone()}}), true, 10_010),
        (json!({"tags": {"$in": ["t9999"]}}), true, 10_010),
        (json!({"n": {"$in": [1, 5.0]}}), true, 10),
        // Deep equality counts its nodes.
        (json!({"nums": {"$eq": nums}}), true, 1_010),
    ];
    for (f, want, enough) in cases {
        let c = Filter::compile(&f).unwrap();
        assert_eq!(c.matches(&body), want, "{f}");
        assert_eq!(c.matches_within(&body, enough), Ok(want), "{f}");
        assert_eq!(c.matches_within(&body, 1), Err(TooCostly(1)), "{f}");
    }
    // The most a filter can ask of a body: every clause scanning a large array.
    let clauses: Vec<Value> = (0..MAX_CLAUSES / 2 - 1)
        .map(|i| json!({"tags": {"$in": [format!("x{i}")]}}))
        .collect();
    let worst = Filter::compile(&json!({ "$or": clauses })).unwrap();
    assert_eq!(
        worst.matches_within(&body, 100_000),
        Err(TooCostly(100_000))
    );
    assert!(!worst.matches(&body));
}
