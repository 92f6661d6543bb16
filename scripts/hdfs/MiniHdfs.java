// Starts Hadoop's MiniDFSCluster (one NameNode, one DataNode, in this JVM) with WebHDFS on loopback, for
// ramgrid's tests, demo and benchmark. Prints one line `MINIHDFS {"webhdfs": port, "rpc": port, ...}` once
// the cluster is up, then runs until its standard input closes (so it never outlives the process that
// started it) or it is killed. Usage: java -cp 'lib/*' MiniHdfs.java <base-dir>
import java.io.File;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.HdfsConfiguration;
import org.apache.hadoop.hdfs.MiniDFSCluster;

public class MiniHdfs {
    public static void main(String[] args) throws Exception {
        if (args.length != 1) {
            System.err.println("usage: MiniHdfs <base-dir>");
            System.exit(2);
        }
        Configuration conf = new HdfsConfiguration();
        conf.setBoolean("dfs.webhdfs.enabled", true);
        // Tests write as whoever runs them; HDFS's own permission checks are not under test.
        conf.setBoolean("dfs.permissions.enabled", false);
        conf.set("dfs.namenode.http-address", "127.0.0.1:0");
        conf.set("dfs.datanode.address", "127.0.0.1:0");
        conf.set("dfs.datanode.http.address", "127.0.0.1:0");
        conf.set("dfs.datanode.ipc.address", "127.0.0.1:0");
        conf.set("hadoop.security.authentication", "simple");
        // Small files dominate the tests: keep the block size small so multi-block files are cheap.
        conf.setLong("dfs.blocksize", 1L << 20);
        conf.setLong("dfs.namenode.fs-limits.min-block-size", 4096);
        MiniDFSCluster cluster = new MiniDFSCluster.Builder(conf, new File(args[0]))
                .numDataNodes(1)
                .nameNodePort(0)
                .nameNodeHttpPort(0)
                .format(true)
                .build();
        cluster.waitActive();
        Runtime.getRuntime().addShutdownHook(new Thread(cluster::shutdown));
        int http = cluster.getNameNode().getHttpAddress().getPort();
        int rpc = cluster.getNameNodePort();
        System.out.println("MINIHDFS {\"webhdfs\": " + http + ", \"rpc\": " + rpc + "}");
        System.out.flush();
        while (System.in.read() >= 0) {
            // Keep running until the parent closes our stdin.
        }
        // Nothing in the cluster outlives this JVM (its storage is the caller's temporary folder), so stop at
        // once rather than wait for the orderly shutdown's thread joins (several seconds).
        Runtime.getRuntime().halt(0);
    }
}
