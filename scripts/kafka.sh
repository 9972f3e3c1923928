#!/usr/bin/env bash
# A real Apache Kafka broker on loopback, for tests/kafka.rs and for trying
# hoist by hand:
#
#   scripts/kafka.sh build    # fetches the broker's jars (see below)
#   scripts/kafka.sh up       # builds if needed, starts one KRaft node,
#                             # prints its plaintext bootstrap address last
#   scripts/kafka.sh down     # stops exactly what `up` started
#
# What runs: one Kafka process that is both broker and controller (KRaft),
# Kafka 4.1.1 as tools/kafka/pom.xml pins it, with four client listeners on
# free loopback ports, their addresses in `$KAFKA_DIR/ports.env`:
#   PLAINTEXT  no authentication
#   SASL       SASL_PLAINTEXT with PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512,
#              user `hoist`, password `hoist-secret` for each
#   TLS        SSL, a server certificate for 127.0.0.1 signed by a CA made
#              here ($KAFKA_DIR/pki/ca.crt), client certificates required
#              (client.crt, client.key from the same CA)
#   SASL_TLS   SASL_SSL with SCRAM-SHA-512, the same certificate and user
# Its log dir and logs are under $KAFKA_DIR; -Xmx512m (about 370 MB RSS).
#
# Where it comes from: Maven Central only. `build` runs Maven on
# tools/kafka/pom.xml (kafka_2.13 and the SLF4J binding it lacks), whose
# maven-dependency-plugin copies the jars into target/kafka/lib; Maven's own
# cache (~/.m2) is kept, so a second build, also from a fresh clone, copies
# without downloading. Java 17 and Maven are Debian's
# (`scripts/deps.sh default-jre-headless maven`).
#
# Settings (environment):
#   KAFKA_DIR     where `up` keeps its data, certificates, logs and pid
#                 (default target/kafka/run); `down` stops what was
#                 started from there
#   KAFKA_PARENT  a pid: `up` leaves a watcher that runs `down` when that
#                 process ends (the test binary's own)
#   KAFKA_JMX_PORT  a loopback port for the broker's JMX (no authentication,
#                 127.0.0.1 only), for scripts/bench-keda.sh to read its
#                 request counts (tools/kafka/BrokerMetrics.java); unset: none
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
source scripts/services.sh
LIB="$ROOT/target/kafka/lib"
DIR="${KAFKA_DIR:-$ROOT/target/kafka/run}"
USER_NAME="hoist"
USER_PASSWORD="hoist-secret"

say() { echo "kafka: $*" >&2; }
fail() {
  say "$*"
  exit 1
}

# The pom is the recipe: the jars are copied again when it changes.
stamp_of() { sha256sum "$ROOT/tools/kafka/pom.xml" | cut -d' ' -f1; }

build() {
  local stamp="$LIB/.stamp"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$(stamp_of)" ]; then
    return 0
  fi
  command -v mvn >/dev/null 2>&1 || fail "Maven is needed (scripts/deps.sh maven)"
  command -v java >/dev/null 2>&1 || fail "Java 17 or later is needed (scripts/deps.sh default-jre-headless)"
  say "fetching the broker's jars (tools/kafka/pom.xml) into $LIB"
  rm -rf "$LIB"
  mkdir -p "$LIB"
  mvn -q -B -f "$ROOT/tools/kafka/pom.xml" package -Dkafka.lib="$LIB" >"$ROOT/target/kafka/maven.log" 2>&1 ||
    { tail -30 "$ROOT/target/kafka/maven.log" >&2; fail "Maven failed (target/kafka/maven.log)"; }
  ls "$LIB"/kafka_2.13-*.jar >/dev/null 2>&1 || fail "Maven copied no kafka_2.13 jar into $LIB"
  stamp_of >"$stamp"
}

# Free loopback ports, held by no one when this returns: picked below the
# kernel's ephemeral range, where other clients' and servers' bind(:0)
# never lands, so none is taken before the broker binds it (as the tests'
# own free_port).
free_ports() {
  python3 -c 'import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
ports = []
while len(ports) < '"$1"':
    port = random.randrange(10000, max(low, 10001))
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        continue
    finally:
        s.close()
    if port not in ports:
        ports.append(port)
print(" ".join(map(str, ports)))'
}

# A CA, the broker's certificate (for 127.0.0.1 and localhost) and a client
# certificate, all unencrypted PKCS#8 PEM, which Kafka reads as is.
pki() {
  local pki="$DIR/pki"
  mkdir -p "$pki"
  openssl req -x509 -new -newkey rsa:2048 -nodes -keyout "$pki/ca.key" -subj "/CN=hoist-test-kafka-ca" \
    -days 2 -sha256 -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" -out "$pki/ca.crt" 2>/dev/null
  local name
  for name in broker client; do
    openssl req -new -newkey rsa:2048 -nodes -keyout "$pki/$name.key" -subj "/CN=$name" \
      -out "$pki/$name.csr" 2>/dev/null
    {
      echo "basicConstraints=CA:FALSE"
      echo "keyUsage=critical,digitalSignature,keyEncipherment"
      echo "extendedKeyUsage=serverAuth,clientAuth"
      echo "subjectAltName=IP:127.0.0.1,DNS:localhost"
    } >"$pki/$name.ext"
    openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
      -days 2 -sha256 -extfile "$pki/$name.ext" -out "$pki/$name.crt" 2>/dev/null
  done
  # Kafka's PEM key store: the private key and its certificate chain.
  cat "$pki/broker.key" "$pki/broker.crt" >"$pki/broker.pem"
}

server_properties() {
  local plain="$1" sasl="$2" tls="$3" sasl_tls="$4" controller="$5"
  local scram="org.apache.kafka.common.security.scram.ScramLoginModule required;"
  cat <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$controller
controller.listener.names=CONTROLLER
listeners=PLAINTEXT://127.0.0.1:$plain,SASL://127.0.0.1:$sasl,TLS://127.0.0.1:$tls,SASL_TLS://127.0.0.1:$sasl_tls,CONTROLLER://127.0.0.1:$controller
advertised.listeners=PLAINTEXT://127.0.0.1:$plain,SASL://127.0.0.1:$sasl,TLS://127.0.0.1:$tls,SASL_TLS://127.0.0.1:$sasl_tls
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SASL:SASL_PLAINTEXT,TLS:SSL,SASL_TLS:SASL_SSL,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$DIR/data
num.partitions=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
# Retention's log start moves only through DeleteRecords in the tests, at once.
log.retention.check.interval.ms=1000
# The SASL listener: PLAIN with its user inline, SCRAM users formatted into
# the metadata log (see format below).
listener.name.sasl.sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512
listener.name.sasl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_$USER_NAME="$USER_PASSWORD";
listener.name.sasl.scram-sha-256.sasl.jaas.config=$scram
listener.name.sasl.scram-sha-512.sasl.jaas.config=$scram
listener.name.sasl_tls.sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_tls.scram-sha-512.sasl.jaas.config=$scram
ssl.keystore.type=PEM
ssl.keystore.location=$DIR/pki/broker.pem
ssl.truststore.type=PEM
ssl.truststore.location=$DIR/pki/ca.crt
listener.name.tls.ssl.client.auth=required
EOF
}

log4j_config() {
  cat <<EOF
Configuration:
  Appenders:
    File:
      name: file
      fileName: "$DIR/logs/server.log"
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: INFO
      AppenderRef:
        - ref: file
    Logger:
      - name: kafka.request.logger
        level: WARN
      - name: org.apache.kafka.controller
        level: WARN
EOF
}

running() { [ -f "$DIR/pid" ] && kill -0 "$(cat "$DIR/pid")" 2>/dev/null; }

up() {
  build
  if running; then
    fail "a broker from $DIR is running; scripts/kafka.sh down first"
  fi
  rm -rf "$DIR"
  mkdir -p "$DIR/logs" "$DIR/data"
  pki
  local ports
  read -r -a ports <<<"$(free_ports 5)"
  local plain="${ports[0]}" sasl="${ports[1]}" tls="${ports[2]}" sasl_tls="${ports[3]}" controller="${ports[4]}"
  server_properties "$plain" "$sasl" "$tls" "$sasl_tls" "$controller" >"$DIR/server.properties"
  log4j_config >"$DIR/log4j2.yaml"
  local java=(java -Xmx512m -Xms128m -XX:+UseSerialGC -XX:TieredStopAtLevel=1
    -Dlog4j2.configurationFile="$DIR/log4j2.yaml" -cp "$LIB/*")
  local jmx=()
  if [ -n "${KAFKA_JMX_PORT:-}" ]; then
    # RMI's second port is the same one, and both bind loopback alone.
    jmx=(-Dcom.sun.management.jmxremote -Dcom.sun.management.jmxremote.port="$KAFKA_JMX_PORT"
      -Dcom.sun.management.jmxremote.rmi.port="$KAFKA_JMX_PORT" -Dcom.sun.management.jmxremote.host=127.0.0.1
      -Djava.rmi.server.hostname=127.0.0.1 -Dcom.sun.management.jmxremote.authenticate=false
      -Dcom.sun.management.jmxremote.ssl=false -Dcom.sun.management.jmxremote.local.only=true)
  fi
  # A cluster id is a UUID in URL-safe base64, which starts with `-` once
  # in 64: StorageTool's parser then reads it as an option and fails
  # ("--cluster-id: expected one argument"). Kafka's own random-uuid draws
  # again in that case; so does this.
  cluster_id="$(python3 -c '
import base64, uuid
while True:
    id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    if not id.startswith("-"):
        print(id)
        break
')"
  "${java[@]}" kafka.tools.StorageTool format --config "$DIR/server.properties" \
    --cluster-id "$cluster_id" \
    --add-scram "SCRAM-SHA-256=[name=$USER_NAME,password=$USER_PASSWORD]" \
    --add-scram "SCRAM-SHA-512=[name=$USER_NAME,password=$USER_PASSWORD]" \
    >"$DIR/logs/format.log" 2>&1 || { tail -20 "$DIR/logs/format.log" >&2; fail "formatting the log dir failed"; }
  # Its own session, so `down` stops exactly this process group.
  setsid "${java[@]}" "${jmx[@]}" kafka.Kafka "$DIR/server.properties" >>"$DIR/logs/stdout.log" 2>&1 </dev/null &
  echo $! >"$DIR/pid"
  cat >"$DIR/ports.env" <<EOF
PLAINTEXT=127.0.0.1:$plain
SASL=127.0.0.1:$sasl
TLS=127.0.0.1:$tls
SASL_TLS=127.0.0.1:$sasl_tls
USER=$USER_NAME
PASSWORD=$USER_PASSWORD
EOF
  local started=$SECONDS
  # Ready when the broker has registered and listens on every client port.
  until grep -q "Kafka Server started" "$DIR/logs/server.log" 2>/dev/null; do
    running || { tail -30 "$DIR/logs/server.log" "$DIR/logs/stdout.log" >&2 2>/dev/null; fail "the broker exited"; }
    [ $((SECONDS - started)) -lt 120 ] || { down; fail "the broker did not start within 120 s (logs in $DIR/logs)"; }
    sleep 0.2
  done
  if [ -n "${KAFKA_PARENT:-}" ]; then
    watch_parent "$KAFKA_PARENT" "$ROOT/scripts/kafka.sh" KAFKA_DIR "$DIR"
  fi
  say "up in $((SECONDS - started)) s: logs in $DIR/logs; stop with scripts/kafka.sh down"
  echo "127.0.0.1:$plain"
}

# Stops the broker `up` started from $DIR: its process group, politely first
# (a clean shutdown takes 2-3 s).
down() {
  [ -f "$DIR/pid" ] || return 0
  stop_group "$(cat "$DIR/pid")" 15
  rm -f "$DIR/pid"
}

case "${1:-}" in
  build) build ;;
  up) up ;;
  down) down ;;
  *)
    echo "usage: scripts/kafka.sh build|up|down" >&2
    exit 2
    ;;
esac
