"""The rule table of the offline ``rules`` analyzer: log signal -> incident signature.

Rules are tried in order and the first match wins, so specific rules come before
generic ones (timeouts, connection errors), and change events (deploys, rollbacks,
config changes, restarts) come last: a line that reports a failure is a failure. A rule
matches against a group's template and its examples; a named group ``subject`` in the
pattern (e.g. the service that has no instances) is quoted in the event. A match counts
only when the line asserts it in the rule's ``sense`` (``streams.gateway.rules.language``):
whole words, not negated, and for a failure not ended well ("reconnect succeeded").

Rules describe general failure modes and the documented messages of widely deployed
software (JVM, Linux, Kafka, ZooKeeper, HDFS, OpenStack, Apache); never the service
names or business messages of one system or benchmark: the analyzer is judged on
logs it has never seen.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from streams.gateway.rules.language import Sense

Severity = Literal["info", "low", "medium", "high", "critical"]


@dataclass(frozen=True, slots=True)
class Rule:
    """One incident signature; ``name`` is the stable key fragments are grouped by."""

    name: str
    pattern: re.Pattern[str]
    event: str
    cause: str
    suggestion: str
    severity: Severity
    sense: Sense = "failure"  # how a line can take the match back (a negation, an outcome)


def _rule(
    name: str,
    regex: str,
    event: str,
    cause: str,
    suggestion: str,
    severity: Severity,
    sense: Sense = "failure",
) -> Rule:
    return Rule(name, re.compile(regex, re.IGNORECASE), event, cause, suggestion, severity, sense)


def build_rules() -> tuple[Rule, ...]:
    """Compile the table; called lazily by the analyzer, never at import time."""
    return (
        # --- resources: these outrank everything else they co-occur with ---------
        _rule(
            "memory-exhausted",
            r"OutOfMemory|Out of memory|GC overhead limit exceeded|Java heap space"
            r"|Cannot allocate memory|oom-killer|Killed process \d+|\bMemoryError\b",
            "Memory exhausted",
            "the process ran out of heap or system memory (OOM / GC overhead)",
            "Capture a heap dump or memory profile, raise the heap or container memory limit, "
            "and look for a leak or an unbounded cache/batch",
            "critical",
        ),
        _rule(
            "disk-full",
            r"No space left on device|disk (?:is )?full|Disk quota exceeded"
            r"|insufficient (?:disk )?space|not enough (?:disk )?space",
            "Disk full",
            "writes failed because a file system or quota is full",
            "Free space (logs, old segments, tmp), check retention settings and add capacity; "
            "alert on disk usage before it reaches 100%",
            "critical",
        ),
        # --- monitoring: an alert is how an incident was detected ----------------
        _rule(
            "alert-firing",
            r"\b(?:alert|alarm)\b.{0,80}\bfiring\b|\bFIRING\b|\balert (?:triggered|raised|fired)",
            "Alert fired",
            "the monitoring system raised an alert",
            "Check that the alert led to the failure it reports and that it fired early enough",
            "low",
        ),
        _rule(
            "alert-resolved",
            r"\b(?:alert|alarm)\b.{0,80}\bresolved\b|\bRESOLVED\b",
            "Alert resolved",
            "the monitoring system reported an alert as resolved",
            "No action; the time it resolved is the end of the impact it measured",
            "info",
            sense="state",
        ),
        # --- general failure modes -------------------------------------------------
        _rule(
            "crash-loop",
            r"CrashLoopBackOff|Back-off restarting failed container"
            r"|restarting too (?:often|quickly)|OOMKilled",
            "Crash loop",
            "a container or process keeps crashing and being restarted",
            "Read the last logs and exit code of the crashing container (kubectl logs "
            "--previous); roll back the change that started it",
            "high",
        ),
        _rule(
            "pool-exhausted",
            r"Connection is not available|pool (?:is )?exhausted|Thread starvation"
            r"|too many (?:connections|clients)|remaining connection slots"
            r"|Timeout waiting for (?:idle object|connection)|Cannot get a connection"
            r"|(?:connection|thread) pool (?:is )?(?:full|exhausted)",
            "Connection pool exhausted",
            "every connection or worker of a pool was busy, so callers waited and timed out "
            "(slow queries, leaked connections, or more concurrent callers than the pool holds)",
            "Find what holds the connections (slow queries, leaks, retry storms from callers); "
            "cap caller concurrency and retries before raising the pool size",
            "high",
        ),
        _rule(
            "service-no-instances",
            r"No instances available for (?P<subject>[\w.-]+)|no healthy upstream"
            r"|no endpoints available for service|does not have available server for client",
            "Service discovery: no instances of a downstream service",
            "service discovery found no running instance of the called service, so every "
            "request to it fails immediately (service down, crash-looping or deregistered)",
            "Check the pods of the named service (kubectl get pods/describe), its readiness "
            "probe and its registration; then retry the failed requests",
            "high",
        ),
        _rule(
            "backend-down",
            r"Server (?P<subject>\S+) is DOWN|backend \S+ has no server available"
            r"|(?:upstream|backend) (?:server )?\S* ?(?:is )?(?:down|unhealthy|marked as down)",
            "Backends marked down by health checks",
            "the load balancer's health checks took backend servers out of rotation",
            "Check the named backends' health endpoints and what they depend on at that time",
            "high",
        ),
        # --- Kafka brokers ----------------------------------------------------------
        _rule(
            "kafka-not-leader",
            r"NotLeaderForPartition|not the leader for (?:that|this) (?:topic-)?partition"
            r"|NOT_LEADER",
            "Partition leadership moved",
            "replica fetchers or clients sent requests to a broker that is no longer the "
            "leader of the partition: leadership changed after a broker restart, a "
            "controller failover or a ZooKeeper session expiry",
            "Correlate with controller election and ZooKeeper session logs of the same "
            "minute; check the broker that lost leadership for restarts, long GC pauses or "
            "network trouble; confirm under-replicated partitions return to 0 and run a "
            "preferred leader election if leadership stays unbalanced",
            "high",
        ),
        _rule(
            "kafka-isr-shrink",
            r"Shrinking ISR|ISR shrink|under-?replicated partition",
            "ISR shrink: replicas fell out of sync",
            "followers stopped keeping up with the leader and were removed from the in-sync "
            "replica set, so durability (min.insync.replicas) is at risk",
            "Check the lagging broker (disk, network, GC, replica.lag.time.max.ms) and watch "
            "UnderReplicatedPartitions until it is back to 0",
            "high",
        ),
        _rule(
            "kafka-replica-fetcher",
            r"ReplicaFetcher\w*.{0,80}(?:Error in fetch|Error for partition|exception)"
            r"|Error in fetch",
            "Replica fetcher cannot fetch from the leader",
            "follower replica fetcher threads failed to fetch from the partition leader "
            "(the connection to the leader broker dropped or it stopped answering)",
            "Check that the leader broker is up and reachable on its replication listener; "
            "look for broker restarts or network partitions at the same time",
            "high",
        ),
        _rule(
            "kafka-zk-session",
            r"re-registering broker|SessionExpireListener|zookeeper session (?:has )?expired",
            "Broker ZooKeeper session expired; broker re-registered",
            "the broker lost its ZooKeeper session (long GC pause, network hiccup or an "
            "overloaded ZooKeeper) and had to re-register, which triggers leader changes",
            "Look for GC pauses and network errors before the expiry; consider a larger "
            "zookeeper.session.timeout.ms and check ZooKeeper latency",
            "medium",
        ),
        _rule(
            "kafka-controller-election",
            r"New leader is \d+|LeaderChangeListener|ZookeeperLeaderElector|controller election"
            r"|became the controller",
            "Kafka controller election",
            "a new controller was elected; it reassigns partition leadership, which makes "
            "followers truncate and re-fetch",
            "Find out why the previous controller lost its ZooKeeper session; repeated "
            "elections point to an unstable broker or a too-short session timeout",
            "medium",
        ),
        _rule(
            "kafka-log-truncation",
            r"Truncating log \S+ to offset",
            "Follower logs truncated after a leadership change",
            "followers truncated their logs to the new leader's high watermark; records "
            "above it that were never fully replicated are discarded",
            "Make sure producers use acks=all with min.insync.replicas >= 2 if losing these "
            "records matters; correlate with the leadership change",
            "low",
            sense="state",
        ),
        _rule(
            "kafka-coordinator-move",
            r"Unloading group metadata|on follower transition|Loading offsets and group metadata",
            "Consumer group coordinators moved",
            "leadership of __consumer_offsets partitions moved, so group coordinators "
            "unloaded and reloaded group metadata and consumers will rebalance",
            "Expect consumer rebalances now; if they repeat, stabilise partition leadership first",
            "low",
            sense="state",
        ),
        _rule(
            "kafka-isr-expand",
            r"Expanding ISR",
            "ISR expanded: replicas back in sync",
            "followers caught up with their leaders and rejoined the in-sync replica set "
            "(the recovery side of an earlier shrink or leadership change)",
            "No action if under-replicated partitions are back to 0; keep an eye on the "
            "broker that fell behind",
            "info",
            sense="state",
        ),
        # --- ZooKeeper --------------------------------------------------------------
        _rule(
            "zk-election-unreachable",
            r"Cannot open channel to .{0,40}election address",
            "ZooKeeper peers unreachable on the election port",
            "quorum members cannot connect to each other's leader-election port, so the "
            "ensemble cannot form or keep a quorum",
            "Check that every server is up, that the election ports (3888) are open between "
            "peers and that server.N entries in zoo.cfg match the hosts",
            "high",
        ),
        _rule(
            "zk-quorum-connection",
            r"Connection broken for id|Interrupting SendWorker|Send worker leaving thread"
            r"|Interrupted while waiting for message on queue|GOODBYE",
            "ZooKeeper quorum connections dropping",
            "connections between ZooKeeper peers broke and their send/receive workers "
            "stopped, typically because a peer restarted or the network flapped",
            "Check peer restarts and network stability between ensemble members; frequent "
            "drops lead to repeated leader elections",
            "medium",
        ),
        _rule(
            "zk-election",
            r"(?-i:\bLOOKING\b)|Notification time out|n\.leader|LEADER ELECTION TOOK",
            "ZooKeeper leader election in progress",
            "ensemble members are in LOOKING state exchanging election notifications; the "
            "ensemble does not serve writes until a leader is elected",
            "If elections repeat or take long, check peer connectivity and initLimit/syncLimit",
            "medium",
        ),
        _rule(
            "zk-session-expiry",
            r"Expiring session .{0,40}timeout of|SessionExpiredException",
            "ZooKeeper client sessions expiring",
            "clients stopped heartbeating within their negotiated session timeout, so their "
            "sessions (and ephemeral nodes) were expired",
            "Check client-side GC pauses and network, and whether the session timeout is too "
            "short for the client's workload",
            "medium",
        ),
        _rule(
            "zk-old-client",
            r"Connection request from old client",
            "Old ZooKeeper clients connecting",
            "clients with an old protocol version connect; they are dropped if the server "
            "goes read-only",
            "Upgrade the listed clients",
            "low",
        ),
        _rule(
            "zk-not-serving",
            r"ZooKeeperServer not running|causing shutdown while sock still open",
            "ZooKeeper server not serving clients",
            "the server was not running (no quorum or shutting down) when clients connected",
            "Restore the quorum first; then check why the server shut down",
            "high",
        ),
        # --- HDFS / Hadoop / YARN ------------------------------------------------------
        _rule(
            "hdfs-block-pipeline",
            r"PacketResponder.{0,80}(?:exception|interrupt|error)|Exception in receiveBlock"
            r"|writeBlock .{0,80}received exception|DataXceiver.{0,80}(?:exception|error)",
            "HDFS block write pipeline failures",
            "DataNode PacketResponder/DataXceiver threads failed while writing a block "
            "through the replication pipeline",
            "Check the DataNodes in the pipeline for disk errors, network timeouts and "
            "xceiver limits; HDFS re-replicates affected blocks",
            "high",
        ),
        _rule(
            "hdfs-serve-block",
            r"exception while serving blk",
            "DataNode failed to serve blocks",
            "DataNodes hit exceptions while streaming blocks to readers (clients went away "
            "or the block file could not be read)",
            "Check the DataNode disks and client timeouts; repeated failures for one block "
            "point to a bad replica",
            "medium",
        ),
        _rule(
            "hdfs-bad-block",
            r"(?:Missing|Corrupt) block|blk_\S+ .{0,80}(?:does not exist|not found|is not valid)",
            "Missing or corrupt HDFS blocks",
            "block replicas are missing or failed verification",
            "Run hdfs fsck on the affected paths and check the DataNode disks",
            "high",
        ),
        _rule(
            "yarn-rm-unreachable",
            r"ERROR IN CONTACTING RM|contacting (?:the )?(?:RM|ResourceManager)",
            "Application master cannot reach the ResourceManager",
            "the MapReduce application master failed its heartbeats to the YARN ResourceManager",
            "Check that the ResourceManager is up and reachable (address, port 8030, "
            "failover state)",
            "high",
        ),
        _rule(
            "hdfs-lease-renewal",
            r"Failed to renew lease",
            "HDFS client lease renewal failing",
            "the DFS client could not renew its file lease with the NameNode; open files "
            "will be recovered by the NameNode if this continues",
            "Check NameNode availability and the network path from the client",
            "high",
        ),
        _rule(
            "slow-io",
            r"\bSlow \w+ (?:read|write|took)|took \S+ms \(threshold=",
            "Slow I/O operations",
            "I/O operations took longer than their warning threshold",
            "Check disk and network latency on the hosts involved",
            "low",
        ),
        _rule(
            "address-change",
            r"Address change detected",
            "Service address changed",
            "a remote service's resolved address changed (DNS or IP change, failover)",
            "Confirm the change was intended and clients reconnected to the new address",
            "low",
            sense="state",
        ),
        # --- kernels and hardware ----------------------------------------------------
        _rule(
            "kernel-fatal-interrupt",
            r"kernel panic|Kernel (?:oops|BUG)|\b(?:TLB error|data storage|instruction storage"
            r"|program|machine check) interrupt",
            "Kernel fatal interrupts",
            "kernels took fatal interrupts or panicked, killing what ran on those hosts",
            "Drain the affected hosts, run hardware diagnostics and check whether one host "
            "or one program is responsible",
            "high",
        ),
        _rule(
            "device-probe-failure",
            # the kernel's words for a driver that could not bind a device it probed
            r"\bprobe of \S+ failed with error -?\d+|\bfailed before probe\b",
            "Device probes failed",
            "kernel drivers could not initialise devices they probed; at boot this is usual "
            "for absent or unsupported hardware (empty slots, a framebuffer without a display)",
            "No action unless the device is one the host needs; then check its driver and "
            "the kernel log around the probe",
            "low",
        ),
        _rule(
            "hardware-memory-errors",
            r"parity error|ddr errors?|\bECC\b|correctable error|detected and corrected"
            r"|machine check (?:error|event)|machine check exception(?! polling)",
            "Hardware errors (memory, cache)",
            "memory or cache errors were detected (corrected ones still "
            "indicate failing DIMMs, caches or cables)",
            "Track the error counts per host; replace hardware whose corrected-error rate "
            "keeps climbing",
            "medium",
        ),
        _rule(
            "job-launch-failure",
            r"invalid or missing program image|Error loading \S+",
            "Job launch failures",
            "jobs could not start: the program image or working directory is missing, "
            "unreadable or of the wrong format",
            "Check the job's executable path, permissions and architecture, and that the "
            "file system holding it is mounted on the I/O nodes",
            "high",
        ),
        _rule(
            "mount-failure",
            r"mount FAILED|mount failed|failed to mount",
            "File system mount failures",
            "a network file system (e.g. Lustre) could not be mounted",
            "Check the file system servers and the network to them before rescheduling jobs",
            "high",
        ),
        _rule(
            "core-dumps",
            r"generating core|core files? for program|core dump",
            "Processes dumping core",
            "processes crashed and wrote core files",
            "Collect a core file and the program's stack trace; check whether one program "
            "or one node is responsible",
            "medium",
        ),
        _rule(
            "assertion-failure",
            r"hit ASSERT|assertion failed|Assertion .{0,80} failed",
            "Assertion failures",
            "a program hit an internal assertion, i.e. a state its authors thought impossible",
            "Report to the component owners with the source file and line from the message",
            "high",
        ),
        _rule(
            "alignment-exceptions",
            r"alignment exceptions",
            "Unaligned memory access exceptions",
            "programs performed unaligned floating point or integer accesses that the kernel "
            "had to fix up (slow, and sometimes a sign of memory corruption)",
            "Rebuild the offending program with alignment fixes; ignore if counts are stable",
            "low",
        ),
        _rule(
            "empty-dependency-result",
            r"returned null|Request Failed",
            "Downstream calls returned no result",
            "a service received an empty or failed response from a dependency",
            "Check the dependency's health and its logs for the same trace ids",
            "medium",
        ),
        # --- web servers and OpenStack ------------------------------------------------
        _rule(
            "modjk-error-state",
            r"workerEnv in error state|Can't find child \S+ in scoreboard|mod_jk child init",
            "mod_jk workers in error state",
            "Apache mod_jk connector workers went into an error state (the backend servlet "
            "container is not reachable or the scoreboard is inconsistent)",
            "Check the Tomcat/AJP backends behind mod_jk and restart the affected workers",
            "medium",
        ),
        _rule(
            "forbidden-requests",
            r"Directory index forbidden|client denied by server configuration",
            "Requests denied by server configuration",
            "clients asked for paths the web server is configured to deny",
            "Usually scanners; block the clients if the volume is high, otherwise no action",
            "low",
        ),
        _rule(
            "api-http-exception",
            r"HTTP exception thrown: (?P<subject>[^.\n]{1,60})",
            "API requests rejected with HTTP exceptions",
            "the API rejected requests it could not serve (e.g. events for unknown instances)",
            "Check which callers send these requests; harmless if they are late events for "
            "deleted instances",
            "low",
        ),
        _rule(
            "power-state-mismatch",
            r"While synchronizing instance power states, found \S+ instances in the database "
            r"and \S+ instances on the hypervisor",
            "Instance count mismatch between database and hypervisor",
            "the compute node found a different number of instances in the database than on "
            "the hypervisor (orphaned or untracked VMs)",
            "Reconcile the instances on the host with the database; look for failed deletes",
            "medium",
        ),
        _rule(
            "instance-failure",
            r"\[instance: [^\]]+\].{0,120}(?:fail|error|exception)",
            "Instance operations failing",
            "compute operations on instances failed",
            "Check nova-compute and the hypervisor logs for the instance ids",
            "high",
        ),
        _rule(
            "instance-lifecycle",
            r"\[instance: [^\]]+\]",
            "Instance lifecycle activity",
            "instances were spawned, paused, resumed or terminated on the compute node",
            "No action; use as context for other incidents on the same host",
            "info",
            sense="state",
        ),
        _rule(
            "image-cache",
            r"base (?:or swap )?files?|image \S+ at \(.{0,200}\): (?:checking|in use)",
            "Image cache housekeeping",
            "the compute node's image cache manager scanned base images (unknown ones are "
            "flagged for removal)",
            "No action unless disk is short; unknown base files are removed after the aging period",
            "low",
            sense="state",
        ),
        # --- security ----------------------------------------------------------------
        _rule(
            "auth-failure",
            r"authentication failure|Authentication failed|Failed password|Invalid user"
            r"|check pass; user unknown|POSSIBLE BREAK-IN",
            "Authentication failures",
            "repeated failed logins (a brute-force attempt when they come from few hosts)",
            "Block the offending hosts (fail2ban), disable password login for root and "
            "check that no login succeeded from them",
            "high",
        ),
        _rule(
            "permission-denied",
            r"Permission denied|Access denied|AccessDenied|not authori[sz]ed|EACCES",
            "Permission denied",
            "operations were refused for lack of permissions",
            "Check file ownership/modes or the credentials and roles of the caller",
            "medium",
        ),
        _rule(
            "abnormal-exit",
            r"exited abnormally|terminated abnormally|segfault|Segmentation fault"
            r"|killed by signal",
            "Processes exiting abnormally",
            "processes crashed or exited with a failure status",
            "Check the process's own logs and exit codes; enable core dumps if it repeats",
            "medium",
        ),
        # --- network links: a link coming up is a recovery, not a restart -----------------
        _rule(
            "link-up",
            r"\blink (?:is )?up\b|\bchanged state to up\b|\blink becomes ready\b"
            r"|\bcarrier (?:acquired|detected)\b",
            "Network link up",
            "a network interface gained its link (boot, cable plugged, switch port back)",
            "No action; if an outage preceded it, the time it came up ends the network loss",
            "info",
            sense="state",
        ),
        _rule(
            "link-down",
            r"\blink (?:is )?down\b|\bchanged state to down\b|\bcarrier (?:lost|off)\b",
            "Network link down",
            "a network interface lost its link (cable, switch port, NIC or access point), "
            "or it was taken down at boot or shutdown",
            "Check whether it came back up and what ran over it at the time; repeated drops "
            "point to a cable, a switch port or a NIC",
            "low",
        ),
        # --- generic network ------------------------------------------------------------
        _rule(
            "mail-deferred",
            # sendmail/postfix stat(us)=deferred, exim's "defer (errno)": queued for retry
            r"\bstat(?:us)?=deferred\b|\bdefer \(-?\d+\)",
            "Mail delivery deferred",
            "the mail server could not hand messages to the next relay and queued them for "
            "a retry (the relay refused, was unreachable or did not answer): mail is late, "
            "not lost",
            "Check the relay named in the lines (often a local one that is not running) and "
            "the queue (mailq); deferrals that last for days end in bounces",
            "low",
        ),
        _rule(
            "ui-binding",
            # "connect" of a UI framework binds an interface element to code, no network:
            # AppKit's "Failed to connect (x) outlet from (A) to (B)", Qt's QObject::connect
            r"\bconnect \(\w*\) (?:outlet|action)\b|\bQObject::connect\b",
            "UI bindings not connected",
            "a UI framework could not bind interface elements (outlets, actions, signals) to "
            "the application's code: a defect in the application, not a network failure",
            "Report it to the application's developers; no operational action",
            "low",
        ),
        _rule(
            "dns-failure",
            r"UnknownHostException|Name or service not known|Temporary failure in name"
            r"|could not resolve|NXDOMAIN",
            "DNS resolution failures",
            "host names could not be resolved",
            "Check the DNS servers and the host names in the configuration",
            "high",
        ),
        _rule(
            "tls-failure",
            r"SSLHandshakeException|certificate (?:verify failed|has expired|expired)"
            r"|handshake failure|PKIX path",
            "TLS handshake failures",
            "TLS connections failed (untrusted or expired certificate, protocol mismatch)",
            "Check certificate validity and trust stores on both ends",
            "high",
        ),
        _rule(
            "connection-refused",
            r"Connection refused|ConnectException|Retrying connect to server|Failed to connect"
            r"|could not connect|Unable to connect|No route to host",
            "Connection failures",
            "connections to a remote service were refused or could not be established (the "
            "service is down, not listening, or unreachable)",
            "Check that the target service is running and listening on the expected "
            "host/port, and firewalls between the two",
            "high",
        ),
        _rule(
            "connection-dropped",
            r"Connection reset|reset by peer|Broken pipe|Link has been severed"
            r"|Transport endpoint is not connected|connection abort|EOFException"
            r"|end of stream|\bconnection (?:was |has been )?closed unexpectedly\b"
            # "disconnected" alone is routine (a user logs out, an idle client, a device
            # sleeps); a drop is a connection that was disconnected, or one unexpectedly
            r"|\bconnection\b[^.;,]{0,40}\b(?:was|been|got) disconnected\b"
            r"|\b(?:unexpectedly|abruptly|abnormally) disconnected\b"
            r"|\bdisconnected (?:unexpectedly|abruptly|abnormally)\b",
            "Connections dropped",
            "established connections were closed unexpectedly by the peer or the network",
            "Check the peer for restarts and the network for drops; make clients reconnect "
            "with backoff",
            "medium",
        ),
        _rule(
            "timeout",
            r"timed out|TimeoutException|SocketTimeout|deadline exceeded"
            r"|time-?out (?:exceeded|expired|occurred)|Read timeout|Gateway Time-?out",
            "Timeouts",
            "calls did not complete in time (slow or overloaded dependency, or network loss)",
            "Find the slow dependency from the timing out calls; check its latency and load "
            "before raising timeouts",
            "medium",
        ),
        _rule(
            "http-5xx",
            r"(?:status[:=]?[ \t]*|HTTP/\d(?:\.\d)?\"?[ \t]+|\bcode[:=][ \t]*)5\d\d\b"
            r"|\b5\d\d (?:Internal Server Error|Bad Gateway|Service Unavailable)",
            "HTTP 5xx server errors",
            "the server answered requests with 5xx status codes",
            "Look at the failing endpoints' server-side errors at the same time",
            "high",
        ),
        _rule(
            "http-4xx",
            r"(?:status[:=]?[ \t]*|HTTP/\d(?:\.\d)?\"?[ \t]+|\bcode[:=][ \t]*)4\d\d\b"
            r"|\b4\d\d (?:Bad Request|Unauthorized|Forbidden|Not Found)",
            "HTTP 4xx client errors",
            "requests were rejected with 4xx status codes (bad input, missing resources or "
            "authorisation)",
            "Check which clients and paths get 4xx; fix the callers or the routes",
            "low",
        ),
        # --- user reports: what customers said --------------------------------------
        _rule(
            "user-reports",
            r"(?-i:\bI\b)(?!/)[^.\n]{0,60}\b(?:crash(?:ed|es)?|fail(?:ed|s)?|error|charged|stuck"
            r"|broken|can'?t|cannot|gave up|never (?:received|got))\b"
            r"|\b(?:charged|billed) (?:twice|two times)\b"
            r"|\bmy (?:order|payment|account|card)\b[^.\n]{0,60}\b(?:stuck|no|not|never|failed)\b"
            r"|\b(?:site|app|page|checkout)\b[^.\n]{0,40}\b(?:crash(?:ed)?|slow|spinning|broken"
            r"|does not work|not working)\b",
            "Users report problems",
            "customers reported failures, errors or double charges in their own words",
            "Answer the affected customers and check double charges against the payment records",
            "medium",
        ),
        # --- changes: the usual triggers and mitigations of an incident ------------
        _rule(
            "rollback",
            r"\broll(?:ed|ing)?[ -]?back\b|\brevert(?:ed|ing)? to\b|\bdowngrad(?:e|ed|ing)\b",
            "Rollback",
            "a deployment was rolled back to an earlier version",
            "Keep the rollback until the faulty change is understood; add the failure it "
            "caused to the release checks",
            "info",
            sense="change",
        ),
        _rule(
            "deploy",
            r"\bdeploy(?:ed|ing|ment)?\b|\brollout\b|\brolling update\b"
            r"|\b(?:release|upgrade)[ds]?\b.{0,40}\bv?\d+\.\d+",
            "Deploy",
            "a new version was deployed",
            "Check whether failures started after this deploy; roll back first, debug later",
            "info",
            sense="change",
        ),
        _rule(
            "config-change",
            r"\bconfig(?:uration)? (?:change[sd]?|reload(?:ed)?|updated?)\b"
            r"|\breload(?:ed|ing)? (?:the )?config|feature flags? (?:changed|updated|set)",
            "Configuration change",
            "configuration or feature flags changed at run time",
            "Check whether failures started after this change; keep config changes "
            "reviewable and reversible",
            "info",
            sense="change",
        ),
        _rule(
            "scaling",
            r"\bscal(?:e|ed|ing) (?:up|down|out|in)\b|\breplicas? \d+ ?(?:->|to) ?\d+"
            r"|\|scale\||\bautoscal\w*",
            "Scaling",
            "the number of replicas or instances changed",
            "No action; check whether the change helped",
            "info",
            sense="change",
        ),
        _rule(
            "cleanup",
            r"\bpurg(?:e|ed|ing)\b|\bclean(?:ed)?[ -]?up\b|\bfreed\b",
            "Cleanup",
            "data was purged or cleaned up to free resources",
            "No action; check whether it relieved the failure it was meant to",
            "info",
            sense="change",
        ),
        _rule(
            "restart",
            r"\brestart(?:ed|ing)?\b|\bshutting down\b|\bSIGTERM\b|\bStarted \S+ in \d"
            r"|\bstarting up\b|\bis (?:UP|back up)\b",
            "Restarts",
            "processes or servers restarted or came back",
            "No action if planned; otherwise find what made them restart",
            "low",
            sense="change",
        ),
    )
