// Test infrastructure only (scripts/bench-keda.sh): the broker's own
// counts, read once over JMX from a broker scripts/kafka.sh started with
// KAFKA_JMX_PORT. Run from source, nothing to build:
//
//   java tools/kafka/BrokerMetrics.java 127.0.0.1:PORT
//
// prints, one per line,
//   requests NAME COUNT     requests of that type since the broker started
//                           (RequestMetrics RequestsPerSec's Count, every
//                           API version summed)
//   connections LISTENER N  connections open now (socket-server-metrics'
//                           connection-count, every network thread summed)

import java.util.Map;
import java.util.TreeMap;
import javax.management.MBeanServerConnection;
import javax.management.ObjectName;
import javax.management.remote.JMXConnector;
import javax.management.remote.JMXConnectorFactory;
import javax.management.remote.JMXServiceURL;

public class BrokerMetrics {
  public static void main(String[] args) throws Exception {
    if (args.length != 1) {
      System.err.println("usage: java BrokerMetrics.java HOST:PORT");
      System.exit(2);
    }
    JMXServiceURL url = new JMXServiceURL("service:jmx:rmi:///jndi/rmi://" + args[0] + "/jmxrmi");
    try (JMXConnector connector = JMXConnectorFactory.connect(url)) {
      MBeanServerConnection server = connector.getMBeanServerConnection();
      Map<String, Long> requests = new TreeMap<>();
      ObjectName meters = new ObjectName("kafka.network:type=RequestMetrics,name=RequestsPerSec,*");
      for (ObjectName name : server.queryNames(meters, null)) {
        long count = ((Number) server.getAttribute(name, "Count")).longValue();
        requests.merge(name.getKeyProperty("request"), count, Long::sum);
      }
      Map<String, Long> connections = new TreeMap<>();
      ObjectName sockets = new ObjectName("kafka.server:type=socket-server-metrics,*");
      for (ObjectName name : server.queryNames(sockets, null)) {
        String listener = name.getKeyProperty("listener");
        // Per network thread: type, listener, networkProcessor, nothing
        // more (the per-client-software beans count otherwise).
        if (listener == null || name.getKeyProperty("networkProcessor") == null
            || name.getKeyPropertyList().size() != 3) {
          continue;
        }
        double open = ((Number) server.getAttribute(name, "connection-count")).doubleValue();
        connections.merge(listener, Math.round(open), Long::sum);
      }
      requests.forEach((request, count) -> System.out.println("requests " + request + " " + count));
      connections.forEach((listener, open) -> System.out.println("connections " + listener + " " + open));
    }
  }
}
