// Word count on Hadoop's LocalJobRunner (mapreduce.framework.name=local: maps and reduces as threads in this JVM,
// input and output on the local file system), the Hadoop peer of benchmarks/wordcount.py.
//
//   javac -cp 'lib/*' -d classes WordCount.java
//   java -cp 'classes:lib/*' WordCount INPUT OUTDIR PARALLEL SPLIT_BYTES
//
// Tokens are what Python's str.split() gives: runs of the characters for which Python's str.isspace() is true.
// Java's Character.isWhitespace() leaves out U+0085, U+00A0, U+2007 and U+202F, and regex \s (even with
// UNICODE_CHARACTER_CLASS) leaves out U+001C..U+001F, so the class below lists Python's set explicitly.
// Mapper emits (word, 1), the reducer sums and is also the combiner; PARALLEL map threads and PARALLEL reduce tasks;
// splits of at most SPLIT_BYTES. Output: part-r-* files of "word<TAB>count" lines. On success the last line on
// standard output is "HADOOP_JOB_SECONDS <s>", the time from submitting the job to its completion.
import java.io.IOException;
import java.util.regex.Pattern;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.io.LongWritable;
import org.apache.hadoop.io.Text;
import org.apache.hadoop.mapreduce.Job;
import org.apache.hadoop.mapreduce.Mapper;
import org.apache.hadoop.mapreduce.Reducer;
import org.apache.hadoop.mapreduce.lib.input.FileInputFormat;
import org.apache.hadoop.mapreduce.lib.output.FileOutputFormat;

public class WordCount {
    /** Python's str.isspace() characters (checked against CPython 3.11 over all code points). */
    static final Pattern PY_WHITESPACE = Pattern.compile(
            "[\\u0009-\\u000D\\u001C-\\u0020\\u0085\\u00A0\\u1680\\u2000-\\u200A\\u2028\\u2029\\u202F\\u205F\\u3000]+");

    public static class TokenMapper extends Mapper<LongWritable, Text, Text, LongWritable> {
        private static final LongWritable ONE = new LongWritable(1);
        private final Text word = new Text();

        @Override
        protected void map(LongWritable offset, Text line, Context ctx) throws IOException, InterruptedException {
            for (String token : PY_WHITESPACE.split(line.toString())) {
                if (!token.isEmpty()) { // split() gives a leading "" when the line starts with whitespace
                    word.set(token);
                    ctx.write(word, ONE);
                }
            }
        }
    }

    public static class SumReducer extends Reducer<Text, LongWritable, Text, LongWritable> {
        private final LongWritable total = new LongWritable();

        @Override
        protected void reduce(Text word, Iterable<LongWritable> counts, Context ctx)
                throws IOException, InterruptedException {
            long sum = 0;
            for (LongWritable c : counts) {
                sum += c.get();
            }
            total.set(sum);
            ctx.write(word, total);
        }
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 4) {
            System.err.println("usage: WordCount INPUT OUTDIR PARALLEL SPLIT_BYTES");
            System.exit(2);
        }
        int parallel = Integer.parseInt(args[2]);
        long split = Long.parseLong(args[3]);
        Configuration conf = new Configuration();
        conf.set("mapreduce.framework.name", "local");
        conf.set("fs.defaultFS", "file:///");
        conf.setInt("mapreduce.local.map.tasks.maximum", parallel);
        conf.setInt("mapreduce.local.reduce.tasks.maximum", parallel);
        // waitForCompletion() polls the job every 5 s by default, which would add up to 5 s to a local job.
        conf.setInt("mapreduce.client.completion.pollinterval", 50);
        Job job = Job.getInstance(conf, "wordcount");
        job.setJarByClass(WordCount.class);
        job.setMapperClass(TokenMapper.class);
        job.setCombinerClass(SumReducer.class);
        job.setReducerClass(SumReducer.class);
        job.setOutputKeyClass(Text.class);
        job.setOutputValueClass(LongWritable.class);
        job.setNumReduceTasks(parallel);
        FileInputFormat.addInputPath(job, new Path(args[0]));
        FileInputFormat.setMaxInputSplitSize(job, split);
        FileOutputFormat.setOutputPath(job, new Path(args[1]));
        long t0 = System.nanoTime();
        boolean ok = job.waitForCompletion(false);
        double seconds = (System.nanoTime() - t0) / 1e9;
        if (!ok) {
            System.err.println("word count job failed");
            System.exit(1);
        }
        System.out.println("HADOOP_JOB_SECONDS " + seconds);
    }
}
