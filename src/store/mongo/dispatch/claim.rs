//! A claim on MongoDB: read the lanes, pick due deliveries of the held ones, take free or
//! abandoned lanes when the batch has room, and record the batch in one conditional update of
//! the lane documents; a takeover's losses are charged in transactions of their own.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use mongodb::bson::{doc, Bson, DateTime, Document};
use mongodb::Collection;

use super::due;
use crate::backoff::Backoff;
use crate::store::mongo::conn::transient;
use crate::store::mongo::keys::{held_back, release_keys};
use crate::store::mongo::model::{
    after, all, all_in, candidate_fields, chrono, lane_ids, Candidate, Lane,
};
use crate::store::mongo::{json, MongoStore, DELIVERIES, EVENTS, LANES};
use crate::store::{ClaimRequest, ClaimStats, ClaimedDelivery, LeaseToken, Result};

/// Due deliveries read beyond the batch, so that followers blocked behind a running head of
/// their key do not leave a claim short.
const SLACK: i64 = 100;
/// Due deliveries a search for free lanes with work reads at most.
const PROBE: i64 = 256;
/// How long a lane whose charge conflicted with another transaction waits before it is tried
/// again, by the number of conflicts in a row: a dead client's transaction lasts up to a minute.
const CHARGE_RETRY: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(5));

/// Losses a takeover recorded and has not charged yet.
#[derive(Clone)]
struct Unpaid {
    lane: i32,
    epoch: i64,
    lost: Vec<String>,
}

impl Unpaid {
    fn of(l: &Lane) -> Self {
        Self {
            lane: l.lane,
            epoch: l.epoch,
            lost: l.lost.clone(),
        }
    }

    /// The losses of a takeover that landed.
    fn taken(i: &Intent) -> Option<Self> {
        Some(Self {
            lane: i.lane,
            epoch: i.epoch,
            lost: i.takeover.clone()?,
        })
    }
}

/// What one statement of the lane update means to do.
struct Intent {
    lane: i32,
    epoch: i64,
    picks: Vec<Candidate>,
    takeover: Option<Vec<String>>,
    fresh: bool,
}

impl Intent {
    fn held(l: &Lane, picks: Vec<Candidate>) -> Self {
        Self {
            lane: l.lane,
            epoch: l.epoch,
            picks,
            takeover: None,
            fresh: false,
        }
    }

    /// A free lane taken with `picks`, or taken over with what it had in flight `lost`.
    fn taken(l: &Lane, picks: Vec<Candidate>, lost: Option<Vec<String>>) -> Self {
        Self {
            lane: l.lane,
            epoch: l.epoch + 1,
            picks,
            takeover: lost,
            fresh: true,
        }
    }
}

/// The lane as it was read: the condition of its update.
fn as_read(l: &Lane) -> Document {
    doc! {
        "_id": l.lane, "epoch": l.epoch, "owner": &l.owner, "holder": &l.holder,
        "leaseExpiresAt": l.lease_expires_at, "inFlight": &l.in_flight, "lost": &l.lost,
    }
}

impl MongoStore {
    /// A lane this store instance holds for the worker. Its lease may have expired: until another
    /// worker takes the lane over, the epoch that fences every write is still the worker's, so a
    /// worker that stalled past its lease keeps its lanes and its running deliveries' tokens.
    fn mine(&self, l: &Lane, req: &ClaimRequest) -> bool {
        l.owner.as_deref() == Some(req.owner.as_str())
            && l.holder.as_deref() == Some(self.holder.as_str())
    }

    /// Expired lanes that another worker left with deliveries in flight or losses not charged
    /// (a dead worker's): every claim takes them over, whatever the batch leaves room for, so
    /// that their deliveries wait for the lease and not for this worker's backlog.
    fn abandoned<'l>(&self, lanes: &'l [Lane], req: &ClaimRequest, now: DateTime) -> Vec<&'l Lane> {
        lanes
            .iter()
            .filter(|l| !l.live(now) && !self.mine(l, req) && l.owner.is_some())
            .filter(|l| !(l.in_flight.is_empty() && l.lost.is_empty()))
            .collect()
    }

    /// The free or expired lanes with due work to take, `new_lanes` at most (the probe's), but
    /// for those already `taken`, split into fresh ones and takeovers.
    async fn lanes_to_take<'l>(
        &self,
        coll: &Collection<Document>,
        lanes: &'l [Lane],
        taken: &[&Lane],
        req: &ClaimRequest,
        now: DateTime,
    ) -> Result<(Vec<&'l Lane>, Vec<&'l Lane>)> {
        let free: Vec<&Lane> = lanes
            .iter()
            .filter(|l| !l.live(now) && !self.mine(l, req))
            .filter(|l| !taken.iter().any(|t| t.lane == l.lane))
            .collect();
        let chosen = self.probe(coll, &free, req, now).await?;
        Ok(free
            .into_iter()
            .filter(|l| chosen.contains(&l.lane))
            .partition(|l| l.in_flight.is_empty() && l.lost.is_empty()))
    }

    /// One conditional update per lane the claim writes, and what each means to do: held lanes
    /// get their picks beside what still runs, or are handed back when they run nothing and the
    /// batch had room (unless they keep losses to charge); fresh lanes are taken with their picks; taken-over lanes move
    /// what was in flight into `lost` and are picked from by the next claim.
    fn lane_updates(
        &self,
        held: &[&Lane],
        fresh: &[&Lane],
        takeovers: &[&Lane],
        picks: Vec<Candidate>,
        req: &ClaimRequest,
    ) -> (Vec<Document>, Vec<Intent>) {
        // With room left in the batch, a held lane that got nothing has nothing due; with a
        // full batch it may have (a lane taken over from a dead worker does), and it is kept.
        let short = (picks.len() as i64) < req.batch;
        let mut by_lane: HashMap<i32, Vec<Candidate>> = HashMap::new();
        for p in picks {
            by_lane.entry(p.lane_id).or_default().push(p);
        }
        // The lease runs from its recording on, however long the reads took.
        let lease_until = after(DateTime::now(), req.lease);
        let (mut updates, mut intents) = (vec![], vec![]);
        for l in held {
            let running: Vec<&str> = l
                .in_flight
                .iter()
                .filter(|id| req.outstanding.contains(id))
                .map(String::as_str)
                .collect();
            let p = by_lane.remove(&l.lane).unwrap_or_default();
            let idle = p.is_empty() && running.is_empty() && l.lost.is_empty();
            let update = if idle && short {
                doc! { "$set": {
                    "owner": Bson::Null, "holder": Bson::Null, "leaseExpiresAt": Bson::Null,
                    "inFlight": [],
                } }
            } else if p.is_empty() && (idle || running.len() == l.in_flight.len()) {
                continue;
            } else {
                let in_flight: Vec<&str> = running
                    .into_iter()
                    .chain(p.iter().map(|c| c.id.as_str()))
                    .collect();
                doc! { "$set": { "inFlight": in_flight, "leaseExpiresAt": lease_until } }
            };
            updates.push(doc! { "q": as_read(l), "u": update });
            intents.push(Intent::held(l, p));
        }
        let take = |l: &Lane, in_flight: Vec<&str>, lost: Vec<&str>| {
            doc! { "q": as_read(l), "u": { "$set": {
                "epoch": l.epoch + 1, "owner": &req.owner, "holder": &self.holder,
                "leaseExpiresAt": lease_until, "inFlight": in_flight, "lost": lost,
            } } }
        };
        for l in fresh {
            let Some(p) = by_lane.remove(&l.lane) else {
                continue;
            };
            updates.push(take(l, p.iter().map(|c| c.id.as_str()).collect(), vec![]));
            intents.push(Intent::taken(l, p, None));
        }
        for l in takeovers {
            let lost: Vec<String> = l.lost.iter().chain(&l.in_flight).cloned().collect();
            updates.push(take(l, vec![], lost.iter().map(String::as_str).collect()));
            intents.push(Intent::taken(l, vec![], Some(lost)));
        }
        (updates, intents)
    }

    /// The due deliveries of these lanes, lane by lane in due order: the heads of their keys
    /// (at most `want`), and the followers blocked behind a head, with that head.
    async fn candidates(
        &self,
        coll: &Collection<Document>,
        lanes: &[i32],
        busy: &[&str],
        req: &ClaimRequest,
        now: DateTime,
        want: i64,
    ) -> Result<(Vec<Candidate>, Vec<(String, String)>)> {
        let failed = self.conn.error("could not read due deliveries");
        let mut filter = due(Some(doc! { "$in": lanes }.into()), &req.handlers, now);
        if !busy.is_empty() {
            filter.insert("_id", doc! { "$nin": busy });
        }
        let limit = want + SLACK;
        let cursor = coll
            .clone_with_type::<Candidate>()
            .find(filter)
            .sort(doc! { "laneId": 1, "dueAt": 1, "_id": 1 })
            .projection(candidate_fields())
            .limit(limit)
            .batch_size(limit as u32)
            .await
            .map_err(&failed)?;
        let found = all(cursor).await.map_err(&failed)?;
        let (mut eligible, blocked) = self.split_heads(&found).await?;
        eligible.truncate(want.max(0) as usize);
        Ok((eligible, blocked))
    }

    /// Free or expired lanes with due work, those with the oldest first (so no lane waits behind
    /// others), `new_lanes` at most. One query merges the lanes' ranges of the claim index in due
    /// order and stops after `PROBE` deliveries.
    async fn probe(
        &self,
        coll: &Collection<Document>,
        free: &[&Lane],
        req: &ClaimRequest,
        now: DateTime,
    ) -> Result<Vec<i32>> {
        let failed = self.conn.error("could not look for lanes with due work");
        let lanes: Vec<i32> = free.iter().map(|l| l.lane).collect();
        let cursor = coll
            .find(due(Some(doc! { "$in": lanes }.into()), &req.handlers, now))
            .sort(doc! { "dueAt": 1, "_id": 1 })
            .projection(doc! { "laneId": 1 })
            .limit(PROBE)
            .batch_size(PROBE as u32)
            .await
            .map_err(&failed)?;
        let mut found: Vec<i32> = vec![];
        for d in all(cursor).await.map_err(&failed)? {
            match d.get_i32("laneId") {
                Ok(lane) if !found.contains(&lane) => found.push(lane),
                _ => {}
            }
            if found.len() as i64 >= req.new_lanes {
                break;
            }
        }
        Ok(found)
    }

    /// Sends the lane updates as one command and returns the intents that took effect. When some
    /// did not (another worker, or a failure, changed a lane since it was read), the lanes are
    /// read again to tell which.
    async fn write_lanes(
        &self,
        lanes: &Collection<Lane>,
        updates: Vec<Document>,
        intents: Vec<Intent>,
        req: &ClaimRequest,
    ) -> Result<Vec<Intent>> {
        if updates.is_empty() {
            return Ok(vec![]);
        }
        let failed = self.conn.error("could not record the claim on the lanes");
        let count = updates.len() as i64;
        let reply = self
            .conn
            .database()
            .await?
            .run_command(doc! { "update": lanes.name(), "updates": updates, "ordered": false })
            .await
            .map_err(&failed)?;
        let matched = reply
            .get_i32("n")
            .map(i64::from)
            .or_else(|_| reply.get_i64("n"))
            .unwrap_or(0);
        if matched == count {
            return Ok(intents);
        }
        let ids: Vec<i32> = intents.iter().map(|i| i.lane).collect();
        let now: HashMap<i32, Lane> = all(lanes
            .find(doc! { "_id": { "$in": ids } })
            .await
            .map_err(&failed)?)
        .await
        .map_err(&failed)?
        .into_iter()
        .map(|l| (l.lane, l))
        .collect();
        Ok(intents
            .into_iter()
            .filter(|i| {
                now.get(&i.lane).is_some_and(|l| {
                    l.epoch == i.epoch
                        && l.owner.as_deref() == Some(req.owner.as_str())
                        && l.holder.as_deref() == Some(self.holder.as_str())
                        && i.picks.iter().all(|p| l.in_flight.contains(&p.id))
                        && i.takeover
                            .as_ref()
                            .is_none_or(|lost| lost.iter().all(|id| l.lost.contains(id)))
                })
            })
            .collect())
    }

    /// Charges one attempt to each delivery a takeover lost (burying it at its handler's last
    /// attempt) and clears the lane's `lost`: lane by lane, each in a transaction of its own,
    /// tried once. A dead worker's transaction that wrote those deliveries conflicts with the
    /// charge until the server ends it (`transactionLifetimeLimitSeconds`, 60 s); such a lane
    /// keeps its losses, which are not handed out meanwhile, and is tried again by a later claim
    /// after a back-off (`CHARGE_RETRY`), while the other lanes go on. One dead transaction may
    /// span every lane, so no claim waits on any of them. Returns how many deliveries were
    /// charged, and the lanes whose losses are settled.
    async fn charge(&self, unpaid: &[Unpaid], req: &ClaimRequest) -> Result<(i64, Vec<i32>)> {
        let (mut charged, mut paid) = (0, vec![]);
        for u in unpaid {
            let now = std::time::Instant::now();
            let later = self
                .charge_later
                .lock()
                .expect("charge lock")
                .get(&u.lane)
                .copied();
            if later.is_some_and(|(at, _)| at > now) {
                continue;
            }
            match self.charge_lane(u, req).await {
                Ok(n) => {
                    charged += n;
                    paid.push(u.lane);
                    self.charge_later
                        .lock()
                        .expect("charge lock")
                        .remove(&u.lane);
                    if later.is_some() {
                        tracing::info!(
                            lane = u.lane,
                            deliveries = n,
                            "the taken-over lane's deliveries are charged and run again"
                        );
                    }
                }
                Err(e) if transient(&e) => {
                    let tries = later.map_or(1, |(_, n)| n + 1);
                    let at = now + CHARGE_RETRY.delay(tries);
                    self.charge_later
                        .lock()
                        .expect("charge lock")
                        .insert(u.lane, (at, tries));
                    let error = format!("{e:#}");
                    if tries == 1 {
                        tracing::warn!(
                            lane = u.lane,
                            deliveries = u.lost.len(),
                            error,
                            "a taken-over lane's deliveries are still written by another \
                             transaction (a dead worker's: the server ends it within its \
                             transactionLifetimeLimitSeconds, 60 s by default); they run once it \
                             is gone"
                        );
                    } else {
                        tracing::debug!(lane = u.lane, error, "still waiting to charge the lane");
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok((charged, paid))
    }

    async fn charge_lane(&self, unpaid: &Unpaid, req: &ClaimRequest) -> Result<i64> {
        let deliveries = self.conn.collection(&self.name(DELIVERIES)).await?;
        let lanes = self.conn.collection(&self.name(LANES)).await?;
        let u = unpaid.clone();
        let (handlers, max_attempts) = (req.handlers.clone(), req.max_attempts.clone());
        let last_attempt = move |c: &Candidate| {
            let max = handlers
                .iter()
                .position(|h| *h == c.handler)
                .and_then(|i| max_attempts.get(i).copied())
                .unwrap_or(i32::MAX);
            c.attempts.saturating_add(1) >= max
        };
        let error = format!(
            "lease lost: the worker holding lane {} stopped without completing",
            u.lane
        );
        self.conn
            .transaction_once(
                "could not charge the deliveries of a taken-over lane",
                async move |s| {
                    let cursor = deliveries
                        .clone_with_type::<Candidate>()
                        .find(doc! { "_id": { "$in": &u.lost }, "status": "pending" })
                        .projection(candidate_fields())
                        .session(&mut *s)
                        .await?;
                    let found = all_in(cursor, s).await?;
                    let now = DateTime::now();
                    for dead in [false, true] {
                        let ids: Vec<&str> = found
                            .iter()
                            .filter(|c| last_attempt(c) == dead)
                            .map(|c| c.id.as_str())
                            .collect();
                        if ids.is_empty() {
                            continue;
                        }
                        let status = if dead { "dead" } else { "pending" };
                        deliveries
                        .update_many(
                            doc! { "_id": { "$in": &ids }, "status": "pending" },
                            doc! {
                                "$inc": { "attempts": 1, "claims": 1 },
                                "$set": { "status": status, "lastError": &error, "updatedAt": now },
                            },
                        )
                        .session(&mut *s)
                        .await?;
                    }
                    lanes
                        .update_one(
                            doc! { "_id": u.lane, "epoch": u.epoch },
                            doc! { "$set": { "lost": [] } },
                        )
                        .session(&mut *s)
                        .await?;
                    let buried: Vec<Candidate> =
                        found.iter().filter(|c| last_attempt(c)).cloned().collect();
                    release_keys(&deliveries, s, &held_back(&buried)).await?;
                    Ok(found.len() as i64)
                },
            )
            .await
    }

    /// The claimed deliveries with their events, held lanes first.
    async fn with_events(&self, landed: Vec<Intent>) -> Result<Vec<ClaimedDelivery>> {
        let picks: Vec<(i64, Candidate)> = landed
            .into_iter()
            .flat_map(|i| {
                let epoch = i.epoch;
                i.picks.into_iter().map(move |p| (epoch, p))
            })
            .collect();
        if picks.is_empty() {
            return Ok(vec![]);
        }
        let failed = self.conn.error("could not read the claimed events");
        let mut ids: Vec<&str> = picks.iter().map(|(_, p)| p.event_id.as_str()).collect();
        ids.sort_unstable();
        ids.dedup();
        let events = self.conn.collection(&self.name(EVENTS)).await?;
        let cursor = events
            .find(doc! { "_id": { "$in": &ids } })
            .batch_size(ids.len().max(1) as u32)
            .await
            .map_err(&failed)?;
        let events: HashMap<String, Document> = all(cursor)
            .await
            .map_err(&failed)?
            .into_iter()
            .filter_map(|e| Some((e.get_str("_id").ok()?.to_owned(), e)))
            .collect();
        Ok(picks
            .into_iter()
            .filter_map(|(epoch, p)| {
                let e = events.get(&p.event_id)?;
                Some(ClaimedDelivery {
                    token: LeaseToken {
                        delivery_id: p.id,
                        lane: p.lane_id as i16,
                        epoch,
                        claims: p.claims,
                        row: None,
                    },
                    handler: p.handler,
                    attempts: p.attempts,
                    event_type: e.get_str("type").unwrap_or_default().to_owned(),
                    key: e.get_str("key").ok().map(str::to_owned),
                    payload: json::to_raw(e.get("payload").map(json::to_json).unwrap_or_default()),
                    headers: json::to_raw(
                        e.get("headers")
                            .map(json::to_json)
                            .unwrap_or_else(|| serde_json::json!({})),
                    ),
                    created_at: e
                        .get_datetime("createdAt")
                        .map(|d| chrono(*d))
                        .unwrap_or_default(),
                    event_id: p.event_id,
                })
            })
            .collect())
    }

    /// Leaves out the lanes whose documents break the rules: nothing could be fenced on them.
    /// Each is logged when first found, and once it is sound again.
    fn leave_unsound(&self, lanes: &mut Vec<Lane>) {
        let unsound: BTreeSet<i32> = lanes.iter().filter(|l| !l.sound).map(|l| l.lane).collect();
        let mut known = self.unsound.lock().expect("unsound lanes lock");
        let new: Vec<i32> = unsound.difference(&known).copied().collect();
        if !new.is_empty() {
            tracing::warn!(
                lanes = ?new,
                "lane documents break the rules (an integer epoch, inFlight and lost arrays); their deliveries are not claimed until `relaybus setup` or `relaybus doctor --fix-sql` repairs them"
            );
        }
        let mended: Vec<i32> = known.difference(&unsound).copied().collect();
        if !mended.is_empty() {
            tracing::info!(lanes = ?mended, "lane documents repaired; claimed again");
        }
        *known = unsound;
        lanes.retain(|l| l.sound);
    }

    /// Charges what earlier takeovers lost, picks from the held lanes, takes free and abandoned
    /// lanes when the batch has room, and records it all in the lane documents.
    pub(super) async fn claim_batch(
        &self,
        req: &ClaimRequest,
    ) -> Result<(Vec<ClaimedDelivery>, ClaimStats)> {
        self.adopt_if_due().await;
        let now = DateTime::now();
        let failed = self.conn.error("could not claim deliveries");
        let lanes_coll = self.lane_collection().await?;
        let deliveries = self.conn.collection(&self.name(DELIVERIES)).await?;
        let mut lanes: Vec<Lane> = all(lanes_coll.find(lane_ids()).await.map_err(&failed)?)
            .await
            .map_err(&failed)?;
        self.leave_unsound(&mut lanes);
        lanes.retain(|l| req.lanes.holds(l.lane));
        let mut stats = ClaimStats::default();
        // Losses of an earlier takeover of ours that could not be charged come first.
        let unpaid: Vec<Unpaid> = lanes
            .iter()
            .filter(|l| self.mine(l, req) && !l.lost.is_empty())
            .map(Unpaid::of)
            .collect();
        let (charged, paid) = self.charge(&unpaid, req).await?;
        stats.charged += charged;
        for l in lanes.iter_mut().filter(|l| paid.contains(&l.lane)) {
            l.lost.clear();
        }
        let held: Vec<&Lane> = lanes.iter().filter(|l| self.mine(l, req)).collect();
        // Losses not charged yet are not handed out again before they are.
        let busy: Vec<&str> = held
            .iter()
            .flat_map(|l| l.in_flight.iter().chain(&l.lost).map(String::as_str))
            .collect();
        let mut picks: Vec<Candidate> = vec![];
        let mut blocked = vec![];
        // The held lanes that run nothing first (one taken over from a dead worker, say), then
        // the others, each in due order: a lane's work does not wait for the backlog of lanes
        // the worker is already serving.
        let serving = |l: &&Lane| l.in_flight.iter().any(|id| req.outstanding.contains(id));
        let (serving, idle): (Vec<&Lane>, Vec<&Lane>) = held.iter().copied().partition(serving);
        for lanes in [idle, serving] {
            let want = req.batch - picks.len() as i64;
            if lanes.is_empty() || want <= 0 {
                continue;
            }
            let ids: Vec<i32> = lanes.iter().map(|l| l.lane).collect();
            let (eligible, b) = self
                .candidates(&deliveries, &ids, &busy, req, now, want)
                .await?;
            picks.extend(eligible);
            blocked.extend(b);
        }
        let mut takeovers = self.abandoned(&lanes, req, now);
        let mut fresh = vec![];
        if req.new_lanes > 0 && (picks.len() as i64) < req.batch {
            let (f, t) = self
                .lanes_to_take(&deliveries, &lanes, &takeovers, req, now)
                .await?;
            fresh = f;
            takeovers.extend(t);
            if !fresh.is_empty() {
                let ids: Vec<i32> = fresh.iter().map(|l| l.lane).collect();
                let want = req.batch - picks.len() as i64;
                let (eligible, b) = self
                    .candidates(&deliveries, &ids, &[], req, now, want)
                    .await?;
                picks.extend(eligible);
                blocked.extend(b);
            }
        }
        let (updates, intents) = self.lane_updates(&held, &fresh, &takeovers, picks, req);
        let landed = self.write_lanes(&lanes_coll, updates, intents, req).await?;
        stats.lanes_taken = landed.iter().filter(|i| i.fresh).count() as i64;
        let unpaid: Vec<Unpaid> = landed.iter().filter_map(Unpaid::taken).collect();
        stats.charged += self.charge(&unpaid, req).await?.0;
        self.park(&blocked).await;
        let claimed = self.with_events(landed).await?;
        Ok((claimed, stats))
    }
}
